"""What went wrong talking to an object store, as the one user error: what, why, what to do.

Store clients raise exceptions whose text carries the request's details (headers, signed URLs, SAS tokens);
none of that is shown. Each backend sorts its client's failures into the kinds below and supplies the hint
for its own store (which environment variable, which permission); a message names the URL the user gave and
at most a short error code.
"""

from __future__ import annotations

from inspector.errors import CorruptFileError, InspectorError, OutputError, StoreError
from inspector.text import shown


def code_of(text: object) -> str:
    """A store's error code as a message may show it: printable and short."""
    return shown(str(text))[:40]


def missing_client(scheme: str, package: str, extra: str) -> StoreError:
    return StoreError(
        f"Reading {scheme} paths needs {package}, which is not installed.",
        hint=f"Install the extra: pip install 'zero-inspector[{extra}]'.",
        title="Object store support not installed",
    )


def no_credentials(url: str, hint: str, verb: str = "read") -> StoreError:
    return StoreError(
        f"No credentials to {verb} {shown(url)}.", hint=hint, title="No object store credentials"
    )


def misconfigured(url: str, hint: str) -> StoreError:
    return StoreError(
        f"The object store client for {shown(url)} is not configured.",
        hint=hint,
        title="Object store not configured",
    )


def no_bucket(url: str, where: str, hint: str) -> StoreError:
    return StoreError(
        f"{shown(url)}: the bucket does not exist at {where}.", hint=hint, title="No such bucket"
    )


def denied(url: str, code: str, hint: str) -> StoreError:
    return StoreError(f"{shown(url)}: access denied ({code}).", hint=hint, title="Access denied")


def gone(url: str) -> CorruptFileError:
    """Listed, then not found: a finding about that file (another job pruned the checkpoint), not a store error."""
    return CorruptFileError(
        f"{shown(url)}: the object is gone (it was listed, then not found).",
        hint="The checkpoint changed while it was read; read it again when nothing writes to it.",
        title="Missing file",
    )


def busy(url: str, code: str, hint: str) -> StoreError:
    return StoreError(
        f"{shown(url)}: the store kept refusing requests ({code}) after every retry.",
        hint=hint,
        title="Object store busy",
    )


def changed(url: str) -> CorruptFileError:
    return CorruptFileError(
        f"{shown(url)}: the object changed while it was read.",
        hint="Something rewrote the checkpoint; read it again when nothing writes to it.",
        title="File changed",
    )


def unreachable(url: str, where: str, hint: str, verb: str = "read") -> StoreError:
    return StoreError(
        f"Cannot reach {where} to {verb} {shown(url)}.", hint=hint, title="Object store unreachable"
    )


def appeared(url: str) -> OutputError:
    """A conditional write refused: an output object someone else wrote while this run was writing it."""
    return OutputError(
        f"{shown(url)} appeared while this run was writing it; it was not overwritten.",
        hint="Something else writes to this prefix. Choose another, or pass --overwrite.",
        title="Output not empty",
    )


def broken_off(url: str, where: str) -> StoreError:
    return StoreError(
        f"{shown(url)}: the connection to {where} broke off mid-transfer after every retry.",
        hint="The network or the store is unreliable; try again.",
        title="Object store connection lost",
    )


def timed_out(url: str, what: str, seconds: float, setting: str) -> StoreError:
    """A request past one of its bounds (`remote.backend`): named, never retried into a hang."""
    return StoreError(
        f"{shown(url)}: {what} within {seconds:g} s.",
        hint=f"The store or the network is too slow or not answering; try again, or raise {setting}.",
        title="Object store timed out",
    )


def unproven(url: str, scheme: str) -> StoreError:
    """A protocol whose client cannot show which bytes a ranged read returned: refused, not trusted."""
    return StoreError(
        f"{shown(url)}: reads through {scheme}:// cannot prove that the store returned the byte range asked "
        "for, so they are refused.",
        hint="Copy the checkpoint with the protocol's own tool and give the local folder, or read it over "
        "s3://, gs://, az:// or https://, whose answers are checked.",
        title="Unproven byte ranges",
    )


def refused(url: str, code: str, hint: str) -> StoreError:
    return StoreError(f"{shown(url)}: the store refused the request ({code}).", hint=hint)


def client_failed(url: str, what: str, hint: str) -> InspectorError:
    """A failure no kind above describes: the exception's type name only, never its text."""
    return StoreError(f"{shown(url)}: the object store client failed ({code_of(what)}).", hint=hint)


def truncated(url: str, why: str) -> CorruptFileError:
    return CorruptFileError(
        f"{shown(url)}: {why}.",
        hint="The object is shorter than listed, or the store answered a ranged read wrongly; copy it again.",
    )
