"""What the numbers mean for the person holding the checkpoint: findings, errors first, each with what to do."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inspector.health.stream import Row
from inspector.scan.model import Severity

SIBLING_RATIO = 10.0  # a norm this many times above (or below 1/x of) its siblings' median is reported
GREW_RATIO = 1e4  # exp_avg_sq's norm grown this much since `--against`: more than its own accumulation
# can explain (at a constant gradient it grows at most 1/(1 - beta2) = 1000x from the first step on)
MIN_SIBLINGS = 3
MOVED_SHOWN = 5
_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
_WHERE = {
    "master": "fp32 master",
    "exp_avg": "Adam exp_avg",
    "exp_avg_sq": "Adam exp_avg_sq",
    "module": "16-bit module copy",
    "frozen": "frozen parameter",
    "buffer": "buffer",
}


@dataclass(frozen=True, slots=True)
class HealthFinding:
    severity: Severity
    code: str
    message: str
    hint: str = ""
    tensor: str | None = None
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "severity": str(self.severity),
            "code": self.code,
            "message": self.message,
            "hint": self.hint,
            "tensor": self.tensor,
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class Steps:
    """A tag's two step counts: the engine counts every step, the optimizer only those it took (DeepSpeed
    skips a step whose gradients overflow), so the gap is the skipped steps."""

    global_steps: int | None = None
    optimizer_step: int | None = None

    @property
    def skipped(self) -> int | None:
        if self.global_steps is None or self.optimizer_step is None:
            return None
        return max(self.global_steps - self.optimizer_step, 0)


def sibling_pattern(name: str) -> str:
    """`model.layers.7.mlp.up_proj.weight` -> `model.layers.N.mlp.up_proj.weight` (numbered parts only)."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)", "N", name)


def _nonfinite(rows: Sequence[Row], against: str | None) -> list[HealthFinding]:
    broken = {r.name for r in rows if r.source == "master" and (r.stats.nan or r.stats.inf)}
    out = []
    for r in rows:
        st = r.stats
        if not (st.nan or st.inf) or (r.source == "module" and r.name in broken):
            continue  # a module copy is said once, as its master's error
        parts = [
            f"{n:,} {what}" for n, what in ((st.nan, "NaN"), (st.pos_inf, "+Inf"), (st.neg_inf, "−Inf")) if n
        ]
        what = f"{', '.join(parts)} of {st.numel:,} values in the {_WHERE[r.source]}"
        if r.source in ("master", "frozen"):
            first = (
                f"; none in {against}: it broke after that tag"
                if against and r.against_nonfinite == 0
                else ""
            )
            out.append(
                HealthFinding(
                    Severity.ERROR,
                    f"nonfinite-{r.source}",
                    f"{r.name}: {what}{first}.",
                    "These are the weights an export writes. Do not publish this tag: resume from an earlier "
                    "one (compare with `--against TAG` to find the last sound tag) and lower the learning "
                    "rate or enable gradient clipping.",
                    r.name,
                    r.source,
                )
            )
        elif r.source in ("exp_avg", "exp_avg_sq"):
            out.append(
                HealthFinding(
                    Severity.WARNING,
                    "nonfinite-moment",
                    f"{r.name}: {what}; the master is finite.",
                    "The weights can still be exported. Resuming from this tag, a NaN moment makes its weights "
                    "NaN at the next step and an Inf in exp_avg_sq freezes them for good (Adam's step "
                    "m/sqrt(v) is 0): resume from an earlier tag or reset the optimizer state.",
                    r.name,
                    r.source,
                )
            )
        elif r.source == "module":
            out.append(
                HealthFinding(
                    Severity.WARNING,
                    "nonfinite-module",
                    f"{r.name}: {what}; the fp32 master is finite.",
                    "Export from the masters (the default `--source masters`), not the module copy.",
                    r.name,
                    r.source,
                )
            )
        else:
            out.append(
                HealthFinding(
                    Severity.WARNING if st.nan else Severity.INFO,
                    "nonfinite-buffer",
                    f"{r.name}: {what}.",
                    "Masks often hold −Inf on purpose; a NaN in a buffer is carried into the exported model.",
                    r.name,
                    r.source,
                )
            )
    return out


def _degenerate(rows: Sequence[Row]) -> list[HealthFinding]:
    out = []
    for r in rows:
        st = r.stats
        if r.source == "module":
            continue  # said once, for its master
        severity = Severity.WARNING if r.source in ("master", "exp_avg", "exp_avg_sq") else Severity.INFO
        if st.all_zero:
            hint = (
                "This tensor never received a gradient: check that it is used in the forward pass and "
                "not accidentally detached."
                if r.source in ("exp_avg", "exp_avg_sq")
                else "Expected right after initialisation for biases; after training it means the tensor "
                "got no updates."
            )
            out.append(
                HealthFinding(
                    severity,
                    "all-zero",
                    f"{r.name}: the {_WHERE[r.source]} is all zeros.",
                    hint,
                    r.name,
                    r.source,
                )
            )
        elif st.constant:
            out.append(
                HealthFinding(
                    severity,
                    "constant",
                    f"{r.name}: every value of the {_WHERE[r.source]} is {st.minimum:.6g}.",
                    "Every element got the same gradient: saturated outputs (a diverging run's softmax, a "
                    "dead layer) or a one-element batch."
                    if r.source in ("exp_avg", "exp_avg_sq")
                    else "Expected right after initialisation for norm weights (1.0); after training it "
                    "means the tensor got no updates.",
                    r.name,
                    r.source,
                )
            )
        if st.zero_rows and not st.all_zero:
            rows_total = r.shape[0] if r.shape else 0
            embedding = bool(re.search(r"embed|wte|lm_head|tok", r.name))
            out.append(
                HealthFinding(
                    Severity.INFO if embedding else Severity.WARNING,
                    "zero-rows",
                    f"{r.name}: {st.zero_rows:,} of {rows_total:,} rows of exp_avg_sq are zero throughout.",
                    "Those rows never received a gradient: for an embedding, tokens the data never held; "
                    "elsewhere, dead units (check activations and masking).",
                    r.name,
                    r.source,
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class Siblings:
    """A tensor's norm against the median norm of the same tensor in its sibling layers (same source)."""

    pattern: str  # `model.layers.N.mlp.up_proj.weight`
    count: int  # siblings, itself included
    median: float
    ratio: float  # norm / median


def sibling_ratios(rows: Sequence[Row]) -> dict[tuple[str, str], Siblings]:
    """(name, source) -> its norm relative to its siblings' median, for tensors with at least MIN_SIBLINGS
    finite siblings and a positive median. Shared by the findings and the app's sortable table."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if r.source in ("master", "exp_avg", "exp_avg_sq", "frozen"):
            pattern = sibling_pattern(r.name)
            if pattern != r.name and math.isfinite(r.stats.norm):
                groups[(pattern, r.source)].append(r)
    out: dict[tuple[str, str], Siblings] = {}
    for (pattern, source), members in groups.items():
        if len(members) < MIN_SIBLINGS:
            continue
        median = statistics.median(m.stats.norm for m in members)
        if median <= 0:
            continue
        for m in members:
            out[(m.name, source)] = Siblings(pattern, len(members), median, m.stats.norm / median)
    return out


def _outliers(rows: Sequence[Row]) -> list[HealthFinding]:
    norms = {(r.name, r.source): r.stats.norm for r in rows}
    out = []
    for (name, source), sib in sibling_ratios(rows).items():
        limit = SIBLING_RATIO**2 if source == "exp_avg_sq" else SIBLING_RATIO  # it scales as gradient²
        ratio = sib.ratio
        if limit > ratio > 1 / limit:
            continue
        how = (
            f"{ratio:.3g}× the median"
            if ratio >= 1
            else f"1/{1 / ratio:.3g} of the median"
            if ratio
            else "zero; the median is"
        )
        out.append(
            HealthFinding(
                Severity.WARNING,
                "norm-outlier",
                f"{name}: the {_WHERE[source]}'s L2 norm {norms[(name, source)]:.4g} is {how} "
                f"({sib.median:.4g}) of the {sib.count} {sib.pattern} tensors.",
                "A layer that diverged from its siblings: compare with an earlier tag (`--against`) "
                "to see when it happened.",
                name,
                source,
            )
        )
    return out


def _out_of_sync(rows: Sequence[Row]) -> list[HealthFinding]:
    broken = {r.name for r in rows if r.source == "master" and (r.stats.nan or r.stats.inf)}
    out = []
    for r in rows:
        if r.source == "module" and r.module_differing and r.name not in broken:  # said once, as an error
            out.append(
                HealthFinding(
                    Severity.WARNING,
                    "module-out-of-sync",
                    f"{r.name}: the 16-bit module copy differs from the master cast to {r.dtype} in "
                    f"{r.module_differing:,} of {r.stats.numel:,} values (largest difference "
                    f"{r.module_max_diff:.4g}).",
                    "DeepSpeed copies the masters into the module after every step, so the two come from "
                    "different moments: export from the masters (the default), which resume uses.",
                    r.name,
                    r.source,
                )
            )
    return out


def _moved(rows: Sequence[Row], against: str | None, steps: Steps, then: Steps) -> list[HealthFinding]:
    moved = [r for r in rows if r.source == "master" and r.delta_norm is not None]
    if against is None or not moved:
        return []
    if all(r.delta_norm == 0 for r in moved):
        g0, g = then.global_steps, steps.global_steps
        if g is not None and g0 is not None and g > g0 and then.optimizer_step == steps.optimizer_step:
            return [
                HealthFinding(
                    Severity.WARNING,
                    "unchanged",
                    f"No master changed since {against}: "
                    + (
                        "the step since was skipped"
                        if g - g0 == 1
                        else f"all {g - g0} steps since were skipped"
                    )
                    + f" (global step {g0} -> {g}, the optimizer's step {steps.optimizer_step} in both).",
                    "DeepSpeed skips a step whose gradients overflow, so a run that diverged keeps saving "
                    f"the same weights: it diverged by {against}. Resume from a tag before its gradients grew "
                    "(`--against` earlier tags: exp_avg_sq that grew) with a lower learning rate or gradient "
                    "clipping.",
                )
            ]
        return [
            HealthFinding(
                Severity.INFO,
                "unchanged",
                f"No master changed since {against}.",
                "The two tags hold the same weights: was the second saved before any step?",
            )
        ]
    moved = [r for r in moved if math.isfinite(r.delta_norm or 0.0)]  # NaN/Inf masters: their errors say it
    top = sorted(moved, key=lambda r: -_key(r.delta_rel))[:MOVED_SHOWN]
    return [
        HealthFinding(
            Severity.INFO,
            "moved-most",
            f"{r.name}: moved {r.delta_norm or 0:.4g} since {against} ({_pct(r.delta_rel)} of its norm).",
            "",
            r.name,
            "master",
        )
        for r in top
        if r.delta_norm
    ]


def _grew(rows: Sequence[Row], against: str | None) -> list[HealthFinding]:
    """exp_avg_sq that grew since `against` by more than Adam's own accumulation explains: the gradients
    are exploding, usually a few tags before the loss overflows or the masters go NaN."""
    if against is None:
        return []
    grown = []
    for r in rows:
        then, now = r.against_norm, r.stats.norm
        if r.source == "exp_avg_sq" and then and math.isfinite(then) and now / then >= GREW_RATIO:
            grown.append((now / then, r))
    grown.sort(key=lambda p: -p[0])
    return [
        HealthFinding(
            Severity.WARNING,
            "moment-grew",
            f"{r.name}: the Adam exp_avg_sq's L2 norm grew {ratio:.3g}× since {against} "
            f"({r.against_norm:.4g} -> {r.stats.norm:.4g}): its gradients are exploding.",
            "Within a few steps the loss overflows (DeepSpeed then skips every step) or the weights blow up. "
            "Resume from an earlier tag with a lower learning rate or gradient clipping (DeepSpeed's "
            "`gradient_clipping`, 1.0 unless set).",
            r.name,
            r.source,
        )
        for ratio, r in grown[:MOVED_SHOWN]
    ]


def _skipped(steps: Steps) -> list[HealthFinding]:
    if not steps.skipped:
        return []
    return [
        HealthFinding(
            Severity.INFO,
            "skipped-steps",
            f"{steps.skipped:,} of the {steps.global_steps:,} steps were skipped (global step "
            f"{steps.global_steps:,}, the optimizer's step {steps.optimizer_step:,}).",
            "DeepSpeed skips a step whose gradients overflow. A few early in an fp16 run are its loss scale "
            "settling; many, or all of the latest, mean the run diverged: `--against` an earlier tag shows "
            "when.",
        )
    ]


def _key(v: float | None) -> float:
    return -1.0 if v is None or math.isnan(v) else v


def _pct(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{100 * v:.3g} %"


def shape_changed(
    changes: Sequence[tuple[str, tuple[int, ...], tuple[int, ...]]], against: str
) -> list[HealthFinding]:
    """Masters whose shape differs in `against` (name, shape here, shape there): not compared element by
    element, which would pair unrelated values and report a made-up change."""
    return [
        HealthFinding(
            Severity.WARNING,
            "shape-changed",
            f"{name}: its shape is {_dims(now)} here and {_dims(then)} in {against}; the two are not compared.",
            "A reshaped or transposed parameter between tags: the model changed, or the tags are of "
            "different runs.",
            tensor=name,
        )
        for name, now, then in changes
    ]


def _dims(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def missing_in_against(names: Sequence[str], against: str) -> list[HealthFinding]:
    if not names:
        return []
    shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
    return [
        HealthFinding(
            Severity.INFO,
            "not-in-against",
            f"{len(names)} master(s) have no counterpart of the same size in {against}: {shown}.",
            "Their change is left out.",
        )
    ]


def findings(
    rows: Sequence[Row], against: str | None, steps: Steps = Steps(), then: Steps = Steps()
) -> list[HealthFinding]:
    """Every finding, errors first; within a severity in checkpoint order. `steps` are this tag's step
    counts, `then` the `against` tag's."""
    found = (
        _nonfinite(rows, against)
        + _grew(rows, against)
        + _out_of_sync(rows)
        + _degenerate(rows)
        + _outliers(rows)
        + _moved(rows, against, steps, then)
        + _skipped(steps)
    )
    return sorted(found, key=lambda f: _ORDER[f.severity])  # stable: keeps each kind's order
