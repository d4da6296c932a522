"""One error hierarchy for things a user can fix: what went wrong, why, and what to do.

The CLI prints these without a traceback and exits non-zero; anything else is our bug.
"""

from __future__ import annotations

from inspector.text import shown

# Exit codes, the one definition (README lists them): 0 ok; 1 damaged checkpoint or failed verification;
# 2 bad input or usage; 3 preflight says the job does not fit; 130 interrupted.
EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_CANCELLED = 0, 1, 2, 3, 130


class InspectorError(Exception):
    """A problem the user can act on. `title` is a short headline, `hint` says what to do next."""

    title = "Error"
    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, hint: str = "", title: str | None = None) -> None:
        # escape ∘ redact, once here; a newline too: a message is one line, and a name's newline must not
        # start a line that looks like the tool's own (`__str__` puts the hint on the next)
        message, hint = shown(message), shown(hint)
        super().__init__(message)
        self.message = message
        self.hint = hint
        if title is not None:
            self.title = shown(title)

    def __str__(self) -> str:
        return f"{self.message}\n{self.hint}" if self.hint else self.message


class NotACheckpointError(InspectorError):
    """The path does not hold a DeepSpeed checkpoint we can find."""

    title = "Not a DeepSpeed checkpoint"


class NoSuchTagError(NotACheckpointError):
    """The checkpoint is there, but not the tag asked for (or named in `latest`)."""

    title = "No such tag"


class UnsafePickleError(InspectorError):
    """A pickle asked for a global that is not on the allowlist; nothing was executed."""

    title = "Refused to load an unsafe pickle"
    exit_code = EXIT_DAMAGED


class CorruptFileError(InspectorError):
    """A file is truncated, not a torch zip archive, or internally inconsistent."""

    title = "Damaged checkpoint file"
    exit_code = EXIT_DAMAGED


class InputError(CorruptFileError):
    """The one error of the input boundary: a value read from a file is not what the format allows.

    Names the file and the field path (`optimizer_state_dict.param_groups[1].params`), says what is wrong in
    words, and never echoes the file's content: a crafted value could be a secret read through a link or a
    terminal escape."""

    title = "Damaged or crafted checkpoint file"

    def __init__(self, file: str, field: str, problem: str, *, hint: str = "") -> None:
        self.file = file
        self.field = field
        self.problem = problem
        where = f"{file}: {field}" if field else file  # escaped with the message (InspectorError)
        super().__init__(
            f"{where}: {problem}.",
            hint=hint or "The file is damaged or was crafted; copy it again from a source you trust.",
        )


class StoreError(InspectorError):
    """An object store could not be used (credentials, permissions, a missing bucket, the network): never a
    finding about the checkpoint, whose files may be fine."""

    title = "Object store error"
    exit_code = EXIT_USAGE


class InvalidOptionError(InspectorError):
    """An option the user gave that cannot work (a bad size, an unknown kind, a malformed --part)."""

    title = "Invalid option"


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
