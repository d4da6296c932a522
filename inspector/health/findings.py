"""What the numbers mean for the person holding the checkpoint: findings, errors first, each with what to do."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from inspector.health.records import ORDER, WHERE, HealthFinding, Steps
from inspector.health.since import missing_in_against, moments_grew, moved_most, shape_changed
from inspector.health.stream import Row
from inspector.scan.model import Severity

NO_STEPS = Steps()  # step counts unknown (frozen: one shared default)

# the findings' one face for `health.check` and the app: the records and the comparisons live beside it
__all__ = [
    "HealthFinding",
    "Siblings",
    "Steps",
    "findings",
    "missing_in_against",
    "shape_changed",
    "sibling_pattern",
    "sibling_ratios",
]

SIBLING_RATIO = 10.0  # a norm this many times above (or below 1/x of) its siblings' median is reported
MIN_SIBLINGS = 3


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
        out.append(_nonfinite_finding(r, against))
    return out


def _nonfinite_finding(r: Row, against: str | None) -> HealthFinding:
    """One tensor's NaN/Inf, with what it means for its source: an error in what an export writes, a
    warning in what resume reads, a note (or a warning for NaN) in a buffer."""
    st = r.stats
    parts = [
        f"{n:,} {what}" for n, what in ((st.nan, "NaN"), (st.pos_inf, "+Inf"), (st.neg_inf, "−Inf")) if n
    ]
    what = f"{', '.join(parts)} of {st.numel:,} values in the {WHERE[r.source]}"
    if r.source in ("master", "frozen"):
        first = (
            f"; none in {against}: it broke after that tag" if against and r.against_nonfinite == 0 else ""
        )
        return HealthFinding(
            Severity.ERROR,
            f"nonfinite-{r.source}",
            f"{r.label}: {what}{first}.",
            "These are the weights an export writes. Do not publish this tag: resume from an earlier "
            "one (compare with `--against TAG` to find the last sound tag) and lower the learning "
            "rate or enable gradient clipping.",
            r.name,
            r.source,
        )
    if r.source in ("exp_avg", "exp_avg_sq"):
        return HealthFinding(
            Severity.WARNING,
            "nonfinite-moment",
            f"{r.label}: {what}; the master is finite.",
            "The weights can still be exported. Resuming from this tag, a NaN moment makes its weights "
            "NaN at the next step and an Inf in exp_avg_sq freezes them for good (Adam's step "
            "m/sqrt(v) is 0): resume from an earlier tag or reset the optimizer state.",
            r.name,
            r.source,
        )
    if r.source == "module":
        return HealthFinding(
            Severity.WARNING,
            "nonfinite-module",
            f"{r.label}: {what}; the fp32 master is finite.",
            "Export from the masters (the default `--source masters`), not the module copy.",
            r.name,
            r.source,
        )
    return HealthFinding(
        Severity.WARNING if st.nan else Severity.INFO,
        "nonfinite-buffer",
        f"{r.label}: {what}.",
        "Masks often hold −Inf on purpose; a NaN in a buffer is carried into the exported model.",
        r.name,
        r.source,
    )


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
                    f"{r.label}: the {WHERE[r.source]} is all zeros.",
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
                    f"{r.label}: every value of the {WHERE[r.source]} is {st.minimum:.6g}.",
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
                    f"{r.label}: {st.zero_rows:,} of {rows_total:,} rows of exp_avg_sq are zero throughout.",
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
    labels = {r.name: r.label for r in rows}
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
                f"{labels[name]}: the {WHERE[source]}'s L2 norm {norms[(name, source)]:.4g} is {how} "
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
                    f"{r.label}: the 16-bit module copy differs from the master cast to {r.dtype} in "
                    f"{r.module_differing:,} of {r.stats.numel:,} values (largest difference "
                    f"{r.module_max_diff:.4g}).",
                    "DeepSpeed copies the masters into the module after every step, so the two come from "
                    "different moments: export from the masters (the default), which resume uses.",
                    r.name,
                    r.source,
                )
            )
    return out


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


def findings(
    rows: Sequence[Row], against: str | None, steps: Steps = NO_STEPS, then: Steps = NO_STEPS
) -> list[HealthFinding]:
    """Every finding, errors first; within a severity in checkpoint order. `steps` are this tag's step
    counts, `then` the `against` tag's."""
    found = (
        _nonfinite(rows, against)
        + moments_grew(rows, against)
        + _out_of_sync(rows)
        + _degenerate(rows)
        + _outliers(rows)
        + moved_most(rows, against, steps, then)
        + _skipped(steps)
    )
    return sorted(found, key=lambda f: ORDER[f.severity])  # stable: keeps each kind's order
