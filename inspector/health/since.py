"""Findings that compare the tag with an earlier one (`--against`): the masters that moved most or not at
all, Adam moments that grew past what accumulation explains, shapes that changed, masters with no
counterpart."""

from __future__ import annotations

import math
from collections.abc import Sequence

from inspector.errors import DamagedCheckpointError
from inspector.health.records import HealthFinding, Steps
from inspector.health.stream import Row
from inspector.scan.model import Checkpoint, Severity

GREW_RATIO = 1e4  # exp_avg_sq's norm grown this much since `--against`: more than its own accumulation
# can explain (at a constant gradient it grows at most 1/(1 - beta2) = 1000x from the first step on)
MOVED_SHOWN = 5


def refuse_damaged(other: Checkpoint) -> None:
    """A tag to compare with passes the same damage checks as the tag itself (its scan's error findings: a
    file cut short, a stray or missing rank file): a damaged one is refused, naming the tag and its first
    error, rather than compared in part or not at all with an exit status that says all is well."""
    errors = [f for f in other.findings if f.severity is Severity.ERROR]
    if not errors:
        return
    more = f" ({len(errors)} errors in all)" if len(errors) > 1 else ""
    first = errors[0].message.rstrip(".")
    raise DamagedCheckpointError(
        f"The tag to compare with, {other.tag}, is damaged: {first}{more}. Nothing was compared.",
        hint=f"Run `zero-inspector scan PATH --tag {other.tag}` to see every finding, or compare with another "
        "tag.",
        title="Cannot compare",
    )


def moved_most(rows: Sequence[Row], against: str | None, steps: Steps, then: Steps) -> list[HealthFinding]:
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
            f"{r.label}: moved {r.delta_norm or 0:.4g} since {against} ({_pct(r.delta_rel)} of its norm).",
            "",
            r.name,
            "master",
        )
        for r in top
        if r.delta_norm
    ]


def moments_grew(rows: Sequence[Row], against: str | None) -> list[HealthFinding]:
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
            f"{r.label}: the Adam exp_avg_sq's L2 norm grew {ratio:.3g}× since {against} "
            f"({r.against_norm:.4g} -> {r.stats.norm:.4g}): its gradients are exploding.",
            "Within a few steps the loss overflows (DeepSpeed then skips every step) or the weights blow up. "
            "Resume from an earlier tag with a lower learning rate or gradient clipping (DeepSpeed's "
            "`gradient_clipping`, 1.0 unless set).",
            r.name,
            r.source,
        )
        for ratio, r in grown[:MOVED_SHOWN]
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
