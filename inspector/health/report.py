"""The health report as plain data: rows per tensor and source, roll-ups per submodule, findings, JSON."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inspector.health.findings import HealthFinding
from inspector.health.stream import Row
from inspector.scan.model import Severity

SOURCES = ("master", "module", "exp_avg", "exp_avg_sq", "frozen", "buffer")


@dataclass(frozen=True, slots=True)
class HealthProgress:
    """How far the pass has read (bytes of every stream, the in-step ones included)."""

    bytes_done: int
    bytes_total: int
    jobs_done: int
    jobs_total: int

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0


@dataclass(frozen=True, slots=True)
class ModuleRollup:
    """One submodule's tensors of one source, summed: norms combine as the norm of the concatenation."""

    module: str
    source: str
    depth: int  # parts in the module's name: `model.layers.3` is 3; "" (top level) is 0
    direct: bool  # some tensor sits directly in this module (not only in its children)
    tensors: int
    numel: int
    nan: int
    inf: int
    zeros: int
    absmax: float
    norm: float
    delta_norm: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "source": self.source,
            "depth": self.depth,
            "tensors": self.tensors,
            "numel": self.numel,
            "nan": self.nan,
            "inf": self.inf,
            "zeros": self.zeros,
            "absmax": _num(self.absmax),
            "norm": _num(self.norm),
            "delta_norm": _num(self.delta_norm),
        }


@dataclass(frozen=True)
class HealthReport:
    tag: str
    against: str | None
    stage: int
    rows: tuple[Row, ...]
    modules: tuple[ModuleRollup, ...]
    findings: tuple[HealthFinding, ...]
    bytes_read: int
    seconds: float
    threads: int

    @property
    def errors(self) -> tuple[HealthFinding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    def as_json(self) -> dict[str, Any]:
        """One object. Floats that are not finite are written as the strings "nan", "inf", "-inf" (JSON has
        no such numbers)."""
        return {
            "tag": self.tag,
            "against": self.against,
            "stage": self.stage,
            "tensors": [row_json(r, self.against is not None) for r in self.rows],
            "modules": [m.as_dict() for m in self.modules],
            "findings": [f.as_dict() for f in self.findings],
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "threads": self.threads,
        }


def row_json(r: Row, with_delta: bool) -> dict[str, Any]:
    st = r.stats
    out: dict[str, Any] = {
        "name": r.name,
        "source": r.source,
        "shape": list(r.shape),
        "dtype": r.dtype,
        "numel": st.numel,
        "nan": st.nan,
        "inf": st.inf,
        "pos_inf": st.pos_inf,
        "neg_inf": st.neg_inf,
        "zeros": st.zeros,
        "min": _num(st.minimum),
        "max": _num(st.maximum),
        "absmax": _num(st.absmax),
        "mean": _num(st.mean),
        "std": _num(st.std),
        "norm": _num(st.norm),
    }
    if st.zero_rows is not None:
        out["zero_rows"] = st.zero_rows
    if r.source == "module":
        out["module_max_diff"] = _num(r.module_max_diff)
        out["module_differing"] = r.module_differing
    if with_delta and r.source == "master":
        out["delta_norm"] = _num(r.delta_norm)
        out["delta_rel"] = _num(r.delta_rel)
        out["against_nonfinite"] = r.against_nonfinite
    if with_delta and r.source in ("exp_avg", "exp_avg_sq"):
        out["against_norm"] = _num(r.against_norm)
    return out


def _num(v: float | None) -> float | str | None:
    if v is None:
        return None
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def short(v: float | None) -> str:
    """A statistic as both faces print it: four significant digits, `nan`/`inf`, a dash where there is none
    (no comparison, no finite value)."""
    if v is None:
        return "–"
    return "nan" if math.isnan(v) else f"{v:.4g}"


def natural_key(name: str) -> list[tuple[int, int | str]]:
    """`layers.2` before `layers.10`: digit runs compare as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p]


def ancestors(name: str) -> list[str]:
    """`model.layers.0.mlp.up_proj.weight` -> model, model.layers, model.layers.0, …, model.layers.0.mlp.up_proj."""
    parts = name.split(".")[:-1]
    return [".".join(parts[: i + 1]) for i in range(len(parts))] or [""]


def rollup(rows: Sequence[Row]) -> list[ModuleRollup]:
    """Per submodule at every depth (a tensor counts in each of its ancestors) and source, natural order."""
    acc: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        for m in ancestors(r.name):
            acc.setdefault((m, r.source), []).append(r)
    out = []
    for (module, source), rs in acc.items():
        deltas = [r.delta_norm for r in rs if r.delta_norm is not None]
        absmaxes = [r.stats.absmax for r in rs if not math.isnan(r.stats.absmax)]
        out.append(
            ModuleRollup(
                module=module,
                source=source,
                depth=module.count(".") + 1 if module else 0,
                direct=any(r.module == module for r in rs),
                tensors=len(rs),
                numel=sum(r.stats.numel for r in rs),
                nan=sum(r.stats.nan for r in rs),
                inf=sum(r.stats.inf for r in rs),
                zeros=sum(r.stats.zeros for r in rs),
                absmax=max(absmaxes) if absmaxes else math.nan,
                norm=math.sqrt(sum(r.stats.norm**2 for r in rs)),
                delta_norm=math.sqrt(sum(d * d for d in deltas)) if deltas else None,
            )
        )
    return sorted(out, key=lambda m: (natural_key(m.module), SOURCES.index(m.source)))


def overview(modules: Sequence[ModuleRollup]) -> list[ModuleRollup]:
    """The roll-ups a person reads first: one per numbered block (`model.layers.7`), and the modules outside
    any numbered block that hold tensors themselves (`model.embed_tokens`, `model.norm`)."""
    numbered = {m.module for m in modules if m.module.rpartition(".")[2].isdigit()}

    def inside(name: str) -> bool:
        return any(a in numbered for a in ancestors(name + ".x") if a != name)

    return [
        m
        for m in modules
        if (m.module in numbered and not inside(m.module))
        or (m.direct and not inside(m.module) and m.module not in numbered)
    ]
