"""Ranged reads over `http://` and `https://` whose answers are proven, with every request bounded in time.

fsspec's `cat_file(path, start, end)` hands back a body and hides the status and headers: a server that ignores
`Range` and answers another slice of the right length (or a 200 with other bytes) is indistinguishable from
one that did what was asked. So the read is made here, on fsspec's own aiohttp session (its options, headers
and credentials), with the response in view: a 206 whose `Content-Range` is exactly the range asked and the
object's listed size, or a 200 only when the range asked is the whole object; `identity` encoding only (a
compressed body would be another length of other bytes); exactly `n` bytes, streamed into the caller's
buffer. Every request has a connect timeout, a stall timeout between reads and a total deadline
(`remote.backend`), listings included (the file system is built with them).
"""

from __future__ import annotations

import asyncio
from typing import Any

from inspector.errors import InspectorError
from inspector.remote import errors as err
from inspector.remote.backend import (
    CONNECT_TIMEOUT,
    DEADLINE,
    STALL_TIMEOUT,
    LowSpeed,
    connect_timeout,
    deadline,
    stall_timeout,
)

SCHEMES = ("http", "https")
_PIECE = 1 << 20


def client_timeout() -> Any:
    """aiohttp's timeout for every request of the session: connect, stall between reads, total."""
    import aiohttp

    return aiohttp.ClientTimeout(total=deadline(), sock_connect=connect_timeout(), sock_read=stall_timeout())


def options() -> dict[str, Any]:
    """The HTTPFileSystem options that bound its own requests (listings, sizes) as ours are bounded."""
    return {"client_kwargs": {"timeout": client_timeout()}}


def content_range(start: int, n: int, size: int) -> str:
    return f"bytes {start}-{start + n - 1}/{size}"


class HttpRanges:
    """Proven ranged GETs through one HTTPFileSystem's session and event loop."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def get(self, url: str, start: int, view: memoryview, size: int) -> InspectorError | None:
        """Fill `view` with bytes [start, start + len(view)) of `url` (`size` bytes long, as listed); None
        when filled, the error to retry with when the body broke off; any other failure raises."""
        from fsspec.asyn import sync

        try:
            result: InspectorError | None = sync(
                self.fs.loop, self._get, url, start, view, size, timeout=deadline() + connect_timeout() + 5
            )
        except InspectorError:
            raise
        except Exception as exc:  # fsspec's own timeout, as a backstop to aiohttp's
            if "timeout" in type(exc).__name__.lower():
                raise err.timed_out(url, "the answer did not end", deadline(), DEADLINE[0]) from None
            raise
        return result

    async def _get(self, url: str, start: int, view: memoryview, size: int) -> InspectorError | None:
        import aiohttp

        n = len(view)
        kw = dict(self.fs.kwargs)
        headers = {**kw.pop("headers", {}), "Range": f"bytes={start}-{start + n - 1}"}
        headers["Accept-Encoding"] = "identity"
        kw.pop("timeout", None)
        try:
            session = await self.fs.set_session()
            async with session.get(
                self.fs.encode_url(url), headers=headers, timeout=client_timeout(), **kw
            ) as r:
                _check_answer(url, r.status, r.headers, start, n, size)
                pos, pace = 0, LowSpeed(url)
                async for piece in r.content.iter_chunked(_PIECE):  # each piece as it arrives (≤ _PIECE)
                    pace.got(len(piece))
                    m = len(piece)
                    if pos + m > n:
                        raise err.truncated(
                            url, f"the store returned more than the {n} bytes asked for at {start}"
                        )
                    view[pos : pos + m] = piece
                    pos += m
                if pos != n:
                    raise err.truncated(url, f"the object ends before byte {start + n}")
        except InspectorError:
            raise
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise _timeout(url, exc) from None
        except aiohttp.ClientConnectorError:
            raise err.unreachable(url, _host(url), "Check the URL and the network.") from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return err.broken_off(url, _host(url))  # the caller fetches the range again
        except aiohttp.ClientError as exc:
            raise err.client_failed(url, type(exc).__name__, "Check the URL and the network.") from None
        return None


def _check_answer(url: str, status: int, headers: Any, start: int, n: int, size: int) -> None:
    """Refuse an answer that does not show it is exactly the range asked (before a byte of it is kept)."""
    if status == 404:
        raise err.gone(url)
    if status in (401, 403):
        raise err.denied(url, str(status), "The credentials in use may not read it (FSSPEC_HTTP_* options).")
    if status == 429 or status >= 500:
        raise err.busy(
            url, str(status), "It is throttling or unavailable: try again later (ZI_REMOTE_INFLIGHT=2)."
        )
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    length = headers.get("Content-Length")
    whole = start == 0 and n == size
    if status == 206:
        got = headers.get("Content-Range", "")
        proven = got.strip() == content_range(start, n, size)
    else:  # a 200 is the whole object: right only when the whole object was asked for
        got = f"status {status}"
        proven = status == 200 and whole
    if proven and encoding in ("identity", "") and (length is None or length.strip() == str(n)):
        return
    raise err.truncated(
        url,
        f"the server did not show that it returned bytes {start}-{start + n - 1} of {size} "
        f"(it answered {err.code_of(got) or 'no Content-Range'})",
    )


def _timeout(url: str, exc: BaseException) -> InspectorError:
    text = type(exc).__name__ + " " + str(exc)
    if "connect" in text.lower():
        return err.timed_out(url, "no connection opened", connect_timeout(), CONNECT_TIMEOUT[0])
    if "read" in text.lower():
        return err.timed_out(url, "the server sent nothing", stall_timeout(), STALL_TIMEOUT[0])
    return err.timed_out(url, "the answer did not end", deadline(), DEADLINE[0])


def _host(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rsplit('@', 1)[-1]}"
