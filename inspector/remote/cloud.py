"""The `gs://` and `az://` backend: obstore (Rust's object_store, the `gcs` / `azure` extras), built for ranged
reads (measured ~3x faster than s3fs at 8 requests in flight on 2 cores, with less memory).

Credentials and endpoint come from each store's standard environment, read by obstore itself:
GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT(_KEY), GOOGLE_BEARER_TOKEN, GOOGLE_BASE_URL for GCS;
AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or a SAS token, a client secret, a managed
identity), AZURE_STORAGE_ENDPOINT, AZURE_STORAGE_USE_EMULATOR for Azure, and here also
AZURE_STORAGE_CONNECTION_STRING, which obstore does not read (parsed below). One plain `get` with a single
range and the listed ETag per read, streamed into the caller's buffer in 1 MiB pieces: never `get_ranges`
(which merges every range into one GET) nor a whole-object buffer. obstore's exception text holds the
request URL (a SAS token can be in it); only the exception's kind is shown.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from inspector.errors import InspectorError
from inspector.remote import errors as err
from inspector.remote.backend import (
    DEADLINE,
    Page,
    RawObject,
    client_missing,
    connect_timeout,
    deadline,
    inflight,
    int_env,
    scheme_row,
)
from inspector.text import shown

_PIECE = 1 << 20
_HINTS = {
    "gs": "Set GOOGLE_APPLICATION_CREDENTIALS (a service account or user credentials file), "
    "GOOGLE_SERVICE_ACCOUNT_KEY or GOOGLE_BEARER_TOKEN; GOOGLE_SKIP_SIGNATURE=true for a public bucket.",
    "az": "Set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN, or "
    "AZURE_CLIENT_ID/AZURE_CLIENT_SECRET/AZURE_TENANT_ID), or AZURE_STORAGE_CONNECTION_STRING.",
    "s3": "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile, a role).",
}
_ENDPOINT = {
    "gs": "GOOGLE_BASE_URL",
    "az": "AZURE_STORAGE_ENDPOINT (or the connection string's BlobEndpoint)",
    "s3": "AWS_ENDPOINT_URL",
}
_ENDPOINT_ENV = {"gs": "GOOGLE_BASE_URL", "az": "AZURE_STORAGE_ENDPOINT", "s3": "AWS_ENDPOINT_URL"}
_CONN_KEYS = {
    "accountname": "account_name",
    "accountkey": "account_key",
    "blobendpoint": "endpoint",
    "sharedaccesssignature": "sas_key",
}


def connection_string(text: str) -> dict[str, Any]:
    """Azure's `Key=value;...` connection string as obstore configuration (unknown keys ignored)."""
    config: dict[str, Any] = {}
    fields = dict(
        (k.strip().lower(), v.strip()) for k, sep, v in (p.partition("=") for p in text.split(";")) if sep
    )
    for key, name in _CONN_KEYS.items():
        if fields.get(key):
            config[name] = fields[key]
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        config["use_emulator"] = True
    elif "endpoint" not in config and "account_name" in config:
        scheme = fields.get("defaultendpointsprotocol") or "https"
        suffix = fields.get("endpointsuffix") or "core.windows.net"
        config["endpoint"] = f"{scheme}://{config['account_name']}.blob.{suffix}"
    return config


class CloudBackend:
    """One GCS bucket or Azure container through one obstore store (thread-safe; sync calls release the GIL)."""

    def __init__(self, scheme: str, bucket: str) -> None:
        try:
            from obstore.store import AzureStore, GCSStore, S3Store
        except ImportError:
            raise client_missing(scheme) from None
        self.scheme, self.bucket = scheme, bucket
        self._if_match = True  # dropped if the store says it does not support If-Match
        env = os.environ
        config: dict[str, Any] = {}
        if scheme == "az" and env.get("AZURE_STORAGE_CONNECTION_STRING"):
            config = connection_string(env["AZURE_STORAGE_CONNECTION_STRING"])
        where = config.get("endpoint") or env.get(_ENDPOINT_ENV[scheme])
        self.where = _shown_endpoint(where, scheme)
        client: dict[str, Any] = {
            # object_store bounds a request from connecting to its body's last byte: a dripping or silent
            # server ends at the deadline (it has no separate stall timeout)
            "connect_timeout": timedelta(seconds=connect_timeout()),
            "timeout": timedelta(seconds=deadline()),
            "pool_max_idle_per_host": str(2 * inflight() + 2),
            "user_agent": "zero-inspector",
        }
        emulator = config.get("use_emulator") or env.get("AZURE_STORAGE_USE_EMULATOR", "").lower() == "true"
        if (isinstance(where, str) and where.startswith("http://")) or (scheme == "az" and emulator):
            client["allow_http"] = True  # an emulator or a private endpoint the user named
        retry = {
            "max_retries": int_env("ZI_REMOTE_RETRIES", 6, 0, 20),
            "retry_timeout": timedelta(seconds=min(120.0, deadline())),  # no retry starts after it
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=15),
                "base": 2,
            },
        }
        url = f"{scheme}://{bucket}"
        try:
            cls: Any = {"gs": GCSStore, "az": AzureStore, "s3": S3Store}[scheme]
            self.store = cls(bucket, config=config or None, client_options=client, retry_config=retry)
        except Exception as exc:  # obstore raises ValueError / its own errors for missing configuration
            raise self.error(exc, url) from None

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def list(self, prefix: str) -> Iterator[Page]:
        import obstore

        url = self.url(prefix)
        try:  # object_store walks every page itself; the store bounds what it keeps (MAX_LISTING)
            found: Any = obstore.list_with_delimiter(self.store, prefix.rstrip("/") or None)
        except FileNotFoundError:
            raise err.no_bucket(
                url, self.where, f"Check the {_kind(self.scheme)} name and the endpoint."
            ) from None
        except Exception as exc:
            raise self.error(exc, url) from None
        dirs: list[object] = list(found.get("common_prefixes") or ())
        objects = [_raw(o) for o in found.get("objects") or () if isinstance(o, dict)]
        yield Page(dirs, objects)

    def get_range(
        self, key: str, start: int, view: memoryview, size: int, etag: str
    ) -> InspectorError | None:
        import obstore

        url, n = self.url(key), len(view)
        options: dict[str, Any] = {"range": (start, start + n)}
        if etag and self._if_match:
            options["if_match"] = etag
        try:
            result = obstore.get(self.store, key, options=options)  # type: ignore[arg-type]
        except obstore.exceptions.NotSupportedError:
            if not self._if_match:
                raise err.client_failed(url, "NotSupportedError", self._check()) from None
            self._if_match = False
            return self.get_range(key, start, view, size, etag)
        except FileNotFoundError:
            raise err.gone(url) from None
        except Exception as exc:
            raise self.error(exc, url) from None
        meta = result.meta
        if tuple(result.range) != (start, start + n) or meta.get("size") != size:
            raise err.truncated(url, f"the store did not return the {n} bytes asked for at {start}")
        got = meta.get("e_tag")  # Azure lists it unquoted and answers it quoted
        if etag and isinstance(got, str) and _bare(got) != _bare(etag):
            raise err.changed(url)
        pos = 0
        try:
            for piece in result.stream(min_chunk_size=_PIECE):
                m = len(piece)
                if pos + m > n:
                    raise err.truncated(
                        url, f"the store returned more than the {n} bytes asked for at {start}"
                    )
                view[pos : pos + m] = memoryview(piece)
                pos += m
        except InspectorError:
            raise
        except Exception as exc:  # the body broke off after the headers: the caller fetches the range again
            if _timed_out(str(exc)):
                raise self.error(exc, url) from None  # past the deadline: not retried into a multiple of it
            return err.broken_off(url, self.where)
        if pos != n:
            raise err.truncated(url, f"the object ends before byte {start + n}")
        return None

    def _check(self) -> str:
        return f"Check the URL, {_ENDPOINT[self.scheme]} and the credentials. {_HINTS[self.scheme]}"

    def error(self, exc: BaseException, url: str) -> InspectorError:
        """An obstore failure as a user error: sorted by the exception's kind and a few words of its text,
        none of which is shown (it holds the request URL)."""
        from obstore import exceptions as ox

        text = str(exc).lower()
        if isinstance(exc, ox.PreconditionError):
            return err.changed(url)
        if isinstance(exc, ox.UnauthenticatedError) or "credential" in text or "status code: 401" in text:
            return err.no_credentials(url, _HINTS[self.scheme])
        if isinstance(exc, ox.PermissionDeniedError) or "status code: 403" in text:
            return err.denied(
                url,
                "403",
                f"The credentials in use may not read this {_kind(self.scheme)}: check them and its access "
                "policy; we need to list and read objects.",
            )
        if _timed_out(text):
            return err.timed_out(url, "the store did not answer in full", deadline(), DEADLINE[0])
        if isinstance(exc, ValueError | ox.UnknownConfigurationKeyError):
            return err.misconfigured(url, _HINTS[self.scheme])
        if "connect" in text or "dns" in text or "error sending request" in text:
            return err.unreachable(url, self.where, f"Check {_ENDPOINT[self.scheme]} and the network.")
        if "status code: 429" in text or "status code: 5" in text:
            return err.busy(
                url,
                "throttled",
                "It is throttling or unavailable: try again later, or read with "
                "fewer requests in flight (ZI_REMOTE_INFLIGHT=2).",
            )
        if "containernotfound" in text or ("bucket" in text and "not found" in text):
            return err.no_bucket(url, self.where, f"Check the {_kind(self.scheme)} name and the endpoint.")
        return err.client_failed(url, type(exc).__name__, self._check())


def _timed_out(text: str) -> bool:
    """Whether obstore's message says a bound ran out. Every retried error names its `retry_timeout`
    setting ("max_retries: 10, retry_timeout: 120s"), which says nothing of why it failed: a refused
    connection or a missing container is not a timeout."""
    text = text.lower().replace("retry_timeout", "")
    return "timed out" in text or "timeout" in text


def _bare(etag: str) -> str:
    return etag.removeprefix("W/").strip('"')


def _kind(scheme: str) -> str:
    return "container" if scheme == "az" else "bucket"


def _shown_endpoint(where: object, scheme: str) -> str:
    """An endpoint for messages: scheme, host and path only (a query could hold a SAS token)."""
    if not isinstance(where, str) or not where:
        return scheme_row(scheme).label
    return shown(where.split("?", 1)[0].split("@")[-1])[:80]


def _raw(obj: dict[str, Any]) -> RawObject:
    when = obj.get("last_modified")
    mtime = int(when.timestamp() * 1e9) if isinstance(when, datetime) else 0
    return RawObject(obj.get("path"), obj.get("size"), mtime, obj.get("e_tag"))
