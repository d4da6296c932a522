"""What a health finding is (`HealthFinding`), a tag's step counts (`Steps`) and the words for each source
of values: shared by the findings about one tag (`findings`) and those comparing two (`since`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inspector.scan.model import Severity

ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
WHERE = {
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
