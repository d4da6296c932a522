"""Output files uploaded to a `gs://` or `az://` prefix through obstore: the same `Destination` as `s3://`.

The bucket's own client (`remote.cloud`'s obstore store, with its time bounds and retries) writes. A file of
at most one part is one request, conditional (`mode="create"`: GCS's `ifGenerationMatch=0`, Azure's
`If-None-Match: *`) unless this job or --overwrite may replace the object. A larger file goes up as a
multipart upload (GCS's XML multipart, Azure's blocks), parts of 16 MiB read from the staged file, up to
ZI_S3_UPLOAD_INFLIGHT of them in flight, one large file at a time and holding every slot the single puts
share (so the parts in memory are ZI_S3_UPLOAD_INFLIGHT for the whole run, as on s3://); nothing is visible until the upload is
completed, and a cancel, an error or an interrupt raised while its parts are read aborts it (obstore aborts
the upload when the stream of parts fails). obstore 0.12.1 applies a put mode to single-request uploads
only, so a multipart upload is conditional only as far as the check just before it: the key is looked up
again, and the upload refused if an object appeared there since the run's check.

Every object carries the job's identity and its CRC-32 as metadata (`zi_job`, `zi_crc32`: Azure allows only
identifier-like names). Neither store's checksum is in obstore's answers, so a rerun of the same job keeps an
object only after reading it back: its CRC-32, computed from the bytes the store returns, must equal the one
its metadata records, and its size the one planned. Metadata anyone can copy proves nothing by itself.
There is no listing of open uploads in obstore: a killed run's parts are dropped by the store (Azure discards
uncommitted blocks after 7 days; on GCS a lifecycle rule on incomplete multipart uploads does).
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator
from typing import Any

from inspector.errors import CancelledError, InspectorError
from inspector.remote import errors as err
from inspector.remote.cloud import CloudBackend
from inspector.remote.destination import PrefixDestination, base_part, part_size, pread_all, upload_inflight

META_JOB = "zi_job"
META_CRC = "zi_crc32"
_READ_PIECE = 8 << 20  # reading an object back to prove its CRC-32


class CloudDestination(PrefixDestination):
    """One run's `gs://` or `az://` output prefix: checked before the run, then written file by file;
    `abandon` removes the objects a failed run made (its open upload was aborted when it failed)."""

    def __init__(self, url: str, job: str, overwrite: bool, cancel: threading.Event | None = None) -> None:
        super().__init__(url, job, overwrite, cancel)
        backend = self.store.backend
        assert isinstance(backend, CloudBackend)
        self.cloud: CloudBackend = backend
        self._large = threading.Lock()  # one multipart upload at a time: its parts are the memory in flight

    def _fail(self, exc: BaseException, what: str) -> InspectorError:
        """An obstore failure of a write as a user error (the text, which holds the request URL, unshown)."""
        from obstore import exceptions as ox

        if isinstance(exc, InspectorError):
            return exc
        if isinstance(exc, ox.AlreadyExistsError | ox.PreconditionError):
            return err.appeared(what)
        if isinstance(exc, ox.PermissionDeniedError) or "status code: 403" in str(exc).lower():
            return err.denied(
                what, "403", "The credentials in use may not write here: we need to list, read, write and "
                "delete objects under the prefix.",
            )  # fmt: skip
        return self.cloud.error(exc, what)

    # -- before the run ---------------------------------------------------------------------------------

    def check(self, names: list[str], *, abort_stale: bool = False) -> None:
        """Refuse objects at planned keys that are neither this job's nor to be overwritten; an object this
        job wrote is reused only once its CRC-32 is read back and proven. `abort_stale` has nothing to do
        here: obstore lists no open uploads, and the stores drop abandoned parts themselves."""
        import obstore

        planned = {self.key(n): n for n in names}
        try:
            listed = [o for page in obstore.list(self.cloud.store, self.prefix or None) for o in page]
        except Exception as exc:
            raise self._fail(exc, self.show()) from None
        self.store.count(requests=1)
        clash: list[str] = []
        for obj in listed:
            key, size = obj.get("path"), obj.get("size")
            if key not in planned or not isinstance(size, int):
                continue
            meta = self._attributes(key, planned[key])
            mine, crc = meta.get(META_JOB) == self.job, meta.get(META_CRC, "")
            proven = mine and crc.isdigit() and self._crc_of(key, planned[key]) == int(crc)  # else: rewritten
            self.found(key, planned[key], size, mine, crc if proven else None, clash)
        self.refuse(clash)

    def _attributes(self, key: str, rel: str) -> dict[str, str]:
        import obstore

        try:
            result = obstore.get(self.cloud.store, key, options={"head": True})
        except FileNotFoundError:
            return {}
        except Exception as exc:
            raise self._fail(exc, self.show(rel)) from None
        self.store.count(requests=1)
        return {str(k): str(v) for k, v in dict(result.attributes).items()}

    def _crc_of(self, key: str, rel: str) -> int | None:
        """The CRC-32 of the object's bytes as the store returns them now (None if it vanished)."""
        import obstore

        crc = 0
        try:
            result = obstore.get(self.cloud.store, key)
            for piece in result.stream(min_chunk_size=_READ_PIECE):
                crc = zlib.crc32(memoryview(piece), crc)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail(exc, self.show(rel)) from None
        self.store.count(requests=1)
        return crc

    # -- the Destination protocol -----------------------------------------------------------------------

    def _upload(self, fd: int, size: int, crc: int, key: str, what: str) -> None:
        meta = {META_JOB: self.job, META_CRC: str(crc)}
        if size <= base_part():  # one request; its bytes count against the parts in memory too
            self._take_slot([])
            try:
                mode = "overwrite" if key in self._replaceable else "create"
                self._put(key, what, pread_all(fd, size, 0), meta, mode=mode, use_multipart=False)
            finally:
                self._slots.release()
        else:
            with self._large:  # one at a time, holding every slot: its parts are all the memory in flight
                held = 0
                try:
                    for _ in range(upload_inflight()):
                        self._take_slot([])
                        held += 1
                    self._multipart(fd, size, key, what, meta)
                finally:
                    for _ in range(held):
                        self._slots.release()

    def _multipart(self, fd: int, size: int, key: str, what: str, meta: dict[str, str]) -> None:
        if key not in self._replaceable and self._exists(key, what):
            raise err.appeared(what)
        step = part_size(size)
        parts = self._parts(fd, size, step)
        self._put(key, what, parts, meta, use_multipart=True, chunk_size=step, max_concurrency=upload_inflight())

    def _parts(self, fd: int, size: int, step: int) -> Iterator[bytes]:
        """The staged file in parts, read as obstore asks for them; a cancel stops the stream, which aborts
        the upload."""
        for offset in range(0, size, step):
            if self.cancel.is_set():
                raise CancelledError("Conversion cancelled.")
            yield pread_all(fd, min(step, size - offset), offset)

    def _put(self, key: str, what: str, body: Any, meta: dict[str, str], **opts: Any) -> None:
        import obstore

        self.store.count(requests=1)
        try:
            obstore.put(self.cloud.store, key, body, attributes=meta, **opts)
        except CancelledError:
            raise
        except Exception as exc:
            raise self._fail(exc, what) from None

    def _exists(self, key: str, what: str) -> bool:
        import obstore

        try:
            obstore.head(self.cloud.store, key)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._fail(exc, what) from None
        return True

    # -- after the run ----------------------------------------------------------------------------------

    def abandon(self) -> None:
        """After a failed, cancelled or interrupted run: remove the objects this run made (its open upload,
        if any, was aborted when its stream of parts failed); objects an earlier run of this job completed
        are kept."""
        import obstore

        self.cancel.set()
        with self._lock:
            made = list(self.created)
        for key in made:
            with contextlib.suppress(Exception):
                obstore.delete(self.cloud.store, key)

    def close(self) -> None:
        """Nothing is held between files (obstore's store is the bucket's, shared with its reads)."""
