"""The `s3://` backend: boto3 (the `s3` extra), for AWS and every S3-compatible store.

The endpoint, region and credentials come from the standard AWS environment (AWS_ENDPOINT_URL, AWS_REGION,
AWS_PROFILE, AWS_ACCESS_KEY_ID, ...), with standard-mode retries and backoff for throttling
(AWS_MAX_ATTEMPTS). Every ranged GET carries the listed ETag (If-Match) and is checked against its
Content-Range. botocore's exceptions carry request details in their text; only the error code is shown.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from inspector.errors import InspectorError
from inspector.remote import errors as err
from inspector.remote.backend import (
    CONNECT_TIMEOUT,
    DEADLINE,
    MAX_LISTING,
    STALL_TIMEOUT,
    LowSpeed,
    Page,
    RawObject,
    client_missing,
    connect_timeout,
    deadline,
    inflight,
    int_env,
    stall_timeout,
)
from inspector.remote.s3_deadline import Timer, bound_headers, headers_timed_out, started_at

T = TypeVar("T")

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
_CHECK = "Check the URL, AWS_ENDPOINT_URL, AWS_REGION and the credentials."
_WRITE_PERMISSIONS = (
    "s3:ListBucket, s3:GetObject, s3:PutObject, s3:ListBucketMultipartUploads, s3:AbortMultipartUpload and "
    "s3:DeleteObject"
)


def endpoint() -> str:
    """The endpoint requests go to, for messages (never the credentials)."""
    return (
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the AWS S3 endpoint"
    )


class S3Backend:
    """One bucket through one boto3 client (thread-safe; connections pooled for the reads in flight)."""

    def __init__(self, scheme: str, bucket: str) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise client_missing(scheme) from None
        self.bucket = bucket
        self._lock = threading.Lock()
        session = boto3.session.Session()
        config = Config(
            retries={"max_attempts": int_env("AWS_MAX_ATTEMPTS", 6, 1, 20), "mode": "standard"},
            connect_timeout=connect_timeout(),
            read_timeout=stall_timeout(),  # between two reads of an answer: a silent server
            max_pool_connections=2 * inflight() + 2,
            user_agent_extra="zero-inspector",
        )
        self.client: Any = session.client("s3", region_name=session.region_name or "us-east-1", config=config)
        bound_headers(self.client)  # botocore bounds each read only: a dripped status line ends at the deadline

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def call(self, url: str, fn: Callable[..., T], **kwargs: Any) -> T:
        """One client call; any botocore failure becomes a user error naming `url`, never a traceback."""
        return self._request(url, fn, kwargs, writing=False)

    def call_write(self, url: str, fn: Callable[..., T], **kwargs: Any) -> T:
        """`call` for a request of an output upload (`remote.upload`), whose refusals read differently:
        permissions to write, a conditional write refused."""
        return self._request(url, fn, kwargs, writing=True)

    def _request(self, url: str, fn: Callable[..., T], kwargs: dict[str, Any], *, writing: bool) -> T:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            if headers_timed_out():
                raise err.timed_out(url, "the answer did not end", deadline(), DEADLINE[0]) from None
            raise store_error(exc, url, writing=writing) from None

    def keys_below(self, prefix: str, url: str) -> dict[str, int]:
        """Every key below `prefix`, at any depth, with its size, for an output's check before it writes (at
        most MAX_LISTING: a bound, not a view of the bucket; the conditional writes cover what it misses)."""
        found: dict[str, int] = {}
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self.call_write(url, self.client.list_objects_v2, **kwargs)
            for obj in page.get("Contents") or ():
                key, size = obj.get("Key"), obj.get("Size")
                if isinstance(key, str) and isinstance(size, int) and not isinstance(size, bool):
                    found[key] = size
            token = page.get("NextContinuationToken")
            if len(found) > MAX_LISTING or not page.get("IsTruncated") or not isinstance(token, str):
                return found
            kwargs["ContinuationToken"] = token

    def open_uploads(self, prefix: str, url: str) -> list[tuple[str, str]]:
        """(key, UploadId) of the multipart uploads in progress below `prefix` (bounded as `keys_below`)."""
        out: list[tuple[str, str]] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self.call_write(url, self.client.list_multipart_uploads, **kwargs)
            for up in page.get("Uploads") or ():
                key, uid = up.get("Key"), up.get("UploadId")
                if isinstance(key, str) and isinstance(uid, str):
                    out.append((key, uid))
            if not page.get("IsTruncated") or len(out) > MAX_LISTING:
                return out
            kwargs |= {
                "KeyMarker": page.get("NextKeyMarker"),
                "UploadIdMarker": page.get("NextUploadIdMarker"),
            }

    def list(self, prefix: str) -> Iterator[Page]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.call(self.url(prefix), self.client.list_objects_v2, **kwargs)
            dirs = [cp.get("Prefix") for cp in page.get("CommonPrefixes") or () if isinstance(cp, dict)]
            objects = [_raw(obj) for obj in page.get("Contents") or () if isinstance(obj, dict)]
            yield Page([d for d in dirs if isinstance(d, str) and d.endswith("/")], objects)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not isinstance(token, str) or not token:
                return

    def get_range(
        self, key: str, start: int, view: memoryview, size: int, etag: str
    ) -> InspectorError | None:
        from botocore.exceptions import (
            ConnectionClosedError,
            IncompleteReadError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        url, n = self.url(key), len(view)
        kwargs = {"Bucket": self.bucket, "Key": key, "Range": f"bytes={start}-{start + n - 1}"}
        if etag:
            kwargs["IfMatch"] = etag
        resp = self.call(url, self.client.get_object, **kwargs)
        body = resp["Body"]
        watchdog = Watchdog(body, deadline())  # a body that drips in under the stall timeout is cut here
        try:
            if (
                resp.get("ContentLength") != n
                or resp.get("ContentRange") != f"bytes {start}-{start + n - 1}/{size}"
            ):
                raise err.truncated(url, f"the store did not return the {n} bytes asked for at {start}")
            pos, pace, read = 0, LowSpeed(url), _arriving(body)
            while pos < n:
                chunk = read(min(1 << 20, n - pos))
                if not chunk:
                    break
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
                pace.got(len(chunk))
            if pos != n and watchdog.fired:  # read1 sees the socket the watchdog shut as an early end
                raise err.timed_out(url, "the answer did not end", deadline(), DEADLINE[0])
            if pos != n:  # the headers promised n bytes: a body cut short is a broken connection, fetched again
                return err.broken_off(url, endpoint())
        except (ConnectionClosedError, IncompleteReadError, ReadTimeoutError, ResponseStreamingError) as exc:
            if watchdog.fired:
                raise err.timed_out(url, "the answer did not end", deadline(), DEADLINE[0]) from None
            if isinstance(exc, ReadTimeoutError):  # a stall is not retried into a multiple of the bound
                raise store_error(exc, url) from None
            return store_error(exc, url)
        finally:
            watchdog.cancel()
            body.close()
        if watchdog.fired:
            raise err.timed_out(url, "the answer did not end", deadline(), DEADLINE[0])
        return None


def _arriving(body: Any) -> Callable[[int], bytes]:
    """A read that returns what has arrived (urllib3's `read1`), so the pace of a body is seen as it comes;
    StreamingBody's own `read(n)` waits for all n bytes."""
    raw = getattr(body, "_raw_stream", None)
    read1 = getattr(raw, "read1", None)
    return read1 if callable(read1) else body.read  # type: ignore[no-any-return]


class Watchdog(Timer):
    """Shuts the connection under a streaming body when the request outlives its deadline: a body that drips
    a byte at a time never trips botocore's read timeout (it bounds each read, not the answer). It counts
    from when the request began waiting for its headers (`remote.s3_deadline`): one deadline for both."""

    def __init__(self, body: Any, seconds: float) -> None:
        raw = getattr(body, "_raw_stream", None)
        conn = getattr(raw, "_connection", None) or getattr(raw, "connection", None)
        super().__init__(getattr(conn, "sock", None), seconds, started_at(conn))


def _raw(obj: dict[str, Any]) -> RawObject:
    when = obj.get("LastModified")
    mtime = int(when.timestamp() * 1e9) if isinstance(when, datetime) else 0
    return RawObject(obj.get("Key"), obj.get("Size"), mtime, obj.get("ETag"))


def store_error(exc: BaseException, url: str, *, writing: bool = False) -> InspectorError:
    """Any botocore failure on `url`, as a user error (a traceback only for what is not botocore's).
    `writing`: the request wrote to the store (an output upload), which needs other permissions."""
    from botocore import exceptions as bx

    verb = "write" if writing else "read"
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return err.no_credentials(
            url,
            "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or run where an instance "
            "role is available); a public bucket still needs credentials here.",
            verb,
        )
    if isinstance(exc, bx.NoRegionError):
        return err.misconfigured(url, "No region: set AWS_REGION (or AWS_DEFAULT_REGION).")
    if isinstance(exc, bx.ClientError):
        return _client_error(exc, url, verb, writing)
    if isinstance(exc, bx.ConnectTimeoutError):
        return err.timed_out(
            url, f"no connection to {endpoint()} opened", connect_timeout(), CONNECT_TIMEOUT[0]
        )
    if isinstance(exc, bx.ReadTimeoutError):
        return err.timed_out(url, "the store sent nothing", stall_timeout(), STALL_TIMEOUT[0])
    if isinstance(exc, bx.EndpointConnectionError | bx.ProxyConnectionError):
        return err.unreachable(
            url, endpoint(), "Check AWS_ENDPOINT_URL and the network; the store did not answer.", verb
        )
    if isinstance(
        exc,
        bx.ConnectionClosedError | bx.IncompleteReadError | bx.ResponseStreamingError,
    ):
        return err.broken_off(url, endpoint())
    if isinstance(exc, bx.BotoCoreError):
        return err.client_failed(url, type(exc).__name__, _CHECK)
    raise exc


def _client_error(exc: Any, url: str, verb: str, writing: bool) -> InspectorError:
    """A request the store answered with an error code, by what the code means."""
    e = exc.response.get("Error", {})
    code = err.code_of(
        str(e.get("Code", "")) or str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    )
    if code == "NoSuchBucket":
        return err.no_bucket(
            url, endpoint(), "Check the bucket name, and AWS_ENDPOINT_URL if the store is not AWS."
        )
    if code in _DENIED:
        need = _WRITE_PERMISSIONS if writing else "s3:ListBucket and s3:GetObject"
        return err.denied(
            url,
            code,
            f"The credentials in use may not {verb} this bucket: check them (AWS_PROFILE, "
            f"AWS_ACCESS_KEY_ID) and the bucket's policy; we need {need}.",
        )
    if code in _MISSING:
        return err.gone(url)
    if code in _BUSY:
        return err.busy(
            url,
            code,
            "It is throttling or unavailable: try again later, or read with fewer requests in "
            "flight (ZI_REMOTE_INFLIGHT=2); AWS_MAX_ATTEMPTS raises the retries.",
        )
    if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") and writing:
        return err.appeared(url)
    if code in ("PreconditionFailed", "412"):
        return err.changed(url)
    return err.refused(url, code, "Check the URL, the credentials and the endpoint.")
