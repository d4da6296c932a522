"""What went wrong talking to an object store, as the one user error: what, why, what to do.

botocore raises a dozen exception types with the request's details (headers, sometimes signed URLs) in
their text; none of that is shown. A message names the URL the user gave and the store's error code only.
"""

from __future__ import annotations

import os

from inspector.errors import CorruptFileError, InspectorError, OutputError, StoreError
from inspector.system.units import printable as shown

_DENIED = {
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "AccountProblem",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_BUSY = {
    "SlowDown",
    "503",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ServiceUnavailable",
    "InternalError",
    "500",
    "RequestTimeout",
}


def endpoint() -> str:
    """The endpoint requests go to, for messages (never the credentials)."""
    return (
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the AWS S3 endpoint"
    )


def missing_client() -> StoreError:
    return StoreError(
        "Reading s3:// paths needs boto3, which is not installed.",
        hint="Install the extra: pip install 'zero-inspector[s3]'.",
        title="Object store support not installed",
    )


def store_error(exc: BaseException, url: str, *, writing: bool = False) -> InspectorError:
    """Any botocore failure on `url`, as a user error (a traceback only for what is not botocore's).
    `writing`: the request wrote to the store (an output upload), which needs other permissions."""
    from botocore import exceptions as bx

    where = shown(url)
    verb = "write" if writing else "read"
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return StoreError(
            f"No credentials to {verb} {where}.",
            hint="Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or run where an instance "
            "role is available); a public bucket still needs credentials here.",
            title="No object store credentials",
        )
    if isinstance(exc, bx.NoRegionError):
        return StoreError(f"No region for {where}.", hint="Set AWS_REGION (or AWS_DEFAULT_REGION).")
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "")) or str(
            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
        code = shown(code)[:40]
        if code == "NoSuchBucket":
            return StoreError(
                f"{where}: the bucket does not exist at {endpoint()}.",
                hint="Check the bucket name, and AWS_ENDPOINT_URL if the store is not AWS.",
                title="No such bucket",
            )
        if code in _DENIED:
            need = (
                "s3:ListBucket, s3:GetObject, s3:PutObject, s3:ListBucketMultipartUploads, "
                "s3:AbortMultipartUpload and s3:DeleteObject"
                if writing
                else "s3:ListBucket and s3:GetObject"
            )
            return StoreError(
                f"{where}: access denied ({code}).",
                hint=f"The credentials in use may not {verb} this bucket: check them (AWS_PROFILE, "
                f"AWS_ACCESS_KEY_ID) and the bucket's policy; we need {need}.",
                title="Access denied",
            )
        if code in _MISSING:
            return CorruptFileError(
                f"{where}: the object is gone (it was listed, then not found).",
                hint="The checkpoint changed while it was read; read it again when nothing writes to it.",
                title="Missing file",
            )
        if code in _BUSY:
            return StoreError(
                f"{where}: the store kept refusing requests ({code}) after every retry.",
                hint="It is throttling or unavailable: try again later, or read with fewer requests in "
                "flight (ZI_S3_INFLIGHT=2); AWS_MAX_ATTEMPTS raises the retries.",
                title="Object store busy",
            )
        if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") and writing:
            return OutputError(
                f"{where} appeared while this run was writing it; it was not overwritten.",
                hint="Something else writes to this prefix. Choose another, or pass --overwrite.",
                title="Output not empty",
            )
        if code in ("PreconditionFailed", "412"):
            return CorruptFileError(
                f"{where}: the object changed while it was read.",
                hint="Something rewrote the checkpoint; read it again when nothing writes to it.",
                title="File changed",
            )
        return StoreError(
            f"{where}: the store refused the request ({code}).",
            hint="Check the URL, the credentials and the endpoint.",
        )
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ProxyConnectionError):
        return StoreError(
            f"Cannot reach {endpoint()} to {verb} {where}.",
            hint="Check AWS_ENDPOINT_URL and the network; the store did not answer.",
            title="Object store unreachable",
        )
    if isinstance(
        exc,
        bx.ReadTimeoutError | bx.ConnectionClosedError | bx.IncompleteReadError | bx.ResponseStreamingError,
    ):
        return StoreError(
            f"{where}: the connection to {endpoint()} broke off mid-transfer after every retry.",
            hint="The network or the store is unreliable; try again.",
            title="Object store connection lost",
        )
    if isinstance(exc, bx.BotoCoreError):
        return StoreError(
            f"{where}: the object store client failed ({type(exc).__name__}).",
            hint="Check the URL, AWS_ENDPOINT_URL, AWS_REGION and the credentials.",
        )
    raise exc


def truncated(url: str, why: str) -> CorruptFileError:
    return CorruptFileError(
        f"{shown(url)}: {why}.",
        hint="The object is shorter than listed, or the store answered a ranged read wrongly; copy it again.",
    )
