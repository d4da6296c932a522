"""One error hierarchy for things a user can fix: what went wrong, why, and what to do.

The CLI prints these without a traceback and exits non-zero; anything else is our bug.
"""

from __future__ import annotations

# Exit codes, the one definition (README lists them): 0 ok; 1 damaged checkpoint or failed verification;
# 2 bad input or usage; 3 preflight says the job does not fit; 130 interrupted.
EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_CANCELLED = 0, 1, 2, 3, 130


class InspectorError(Exception):
    """A problem the user can act on. `title` is a short headline, `hint` says what to do next."""

    title = "Error"
    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, hint: str = "", title: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if title is not None:
            self.title = title

    def __str__(self) -> str:
        return f"{self.message}\n{self.hint}" if self.hint else self.message


class NotACheckpointError(InspectorError):
    """The path does not hold a DeepSpeed checkpoint we can find."""

    title = "Not a DeepSpeed checkpoint"


class UnsafePickleError(InspectorError):
    """A pickle asked for a global that is not on the allowlist; nothing was executed."""

    title = "Refused to load an unsafe pickle"
    exit_code = EXIT_DAMAGED


class CorruptFileError(InspectorError):
    """A file is truncated, not a torch zip archive, or internally inconsistent."""

    title = "Damaged checkpoint file"
    exit_code = EXIT_DAMAGED


class UnsupportedCheckpointError(InspectorError):
    """A valid checkpoint of a kind we do not handle yet (pipeline, MoE, tensor parallel, ...)."""

    title = "Checkpoint layout not supported yet"


class DamagedCheckpointError(InspectorError):
    """The checkpoint has error findings (missing ranks, mixed runs, ...), so it cannot be converted."""

    title = "Damaged checkpoint"
    exit_code = EXIT_DAMAGED


class OutputError(InspectorError):
    """The output location cannot be used (not empty, not writable, disk full, ...)."""

    title = "Cannot write output"


class DoesNotFitError(InspectorError):
    """Preflight says the job cannot fit the machine's memory or disk."""

    title = "Conversion would not fit"
    exit_code = EXIT_DOES_NOT_FIT


class CancelledError(InspectorError):
    """The user cancelled a running job; partial output was removed."""

    title = "Cancelled"
    exit_code = EXIT_CANCELLED
