"""Output files uploaded to a bucket prefix: the `Destination` an OutputRoot publishes through.

`destination_for` builds the one for a URL's scheme, from the scheme table (`remote.backend.SCHEMES`, its
`destination` column): `s3://` here (boto3), `gs://` and `az://` in `remote.cloud_upload` (obstore). What every
store shares (the prefix, the names under the one name rule, the clash refusal, what a rerun reuses) is
`PrefixDestination`. What follows is the S3 one.

Each finished file is uploaded as soon as the writer puts it in place (the engine's shards one by one, in file
order; the index, configs and `latest_universal` after what they name). A file larger than one part goes up
as a multipart upload, parts of 16 MiB (more for a file over 160 GB) read from the staged file, a few in
flight for the whole run (ZI_S3_UPLOAD_INFLIGHT, default 4: memory is that many parts); nothing is visible
until CompleteMultipartUpload, so the open upload is the partial file. Any error, cancel or interrupt aborts
it. Every object carries the job's identity and its CRC-32 as metadata, and is uploaded with S3's own CRC-32
checksum (`ChecksumAlgorithm=CRC32`; a multipart upload as a FULL_OBJECT checksum, checked by the store against
the parts): the store computes it from the bytes it received. A rerun of the same job keeps an object only when
the store's checksum (HeadObject with ChecksumMode) equals the CRC-32 the metadata records and the size is the
one planned: metadata anyone can copy (a sibling's job id with a made-up CRC) proves nothing by itself, and such
an object is rewritten. Everything else is uploaded or rewritten.

An object already at a planned key is replaced only with --overwrite or when this job wrote it (its metadata
says so): the check lists the prefix first, and every write is conditional (`If-None-Match: *`), so an
object that appears meanwhile is not overwritten either. Keys are made of the writer's names, each passing
the one name rule, below the prefix: no `..`, separator or control character can lead out of it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from inspector.errors import CancelledError, OutputError
from inspector.remote.destination import (  # noqa: F401  (the names convert/bucket and the tests use)
    MAX_PARTS,
    PART,
    PrefixDestination,
    base_part,
    destination_for,
    part_size,
    pread_all,
    require_writable,
    upload_inflight,
)
from inspector.remote.s3 import S3Backend

META_JOB = "zi-job"
META_CRC = "zi-crc32"


class BucketDestination(PrefixDestination):
    """One run's `s3://` output prefix: checked before the run, then written file by file by conditional
    multipart uploads through boto3; `abandon` undoes a failed run (open uploads aborted, objects it made
    removed)."""

    def __init__(self, url: str, job: str, overwrite: bool, cancel: threading.Event | None = None) -> None:
        super().__init__(url, job, overwrite, cancel)
        backend = self.store.backend
        assert isinstance(backend, S3Backend)
        self.s3: S3Backend = backend
        self._open: dict[str, str] = {}  # key -> UploadId in progress
        self._pool: ThreadPoolExecutor | None = None

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        """One request of this upload; a failure is the store's user error (a refused condition: an object
        that appeared meanwhile)."""
        self.store.count(requests=1)
        return self.s3.call_write(what, fn, **kwargs)

    # -- before the run ---------------------------------------------------------------------------------

    def check(self, names: list[str], *, abort_stale: bool = False) -> None:
        """Refuse objects at planned keys that are neither this job's nor to be overwritten (objects under the
        prefix this run does not write are left alone); with `abort_stale`, first abort the uploads a killed
        run left open under the planned keys."""
        client = self.s3.client
        planned = {self.key(n): n for n in names}
        for key, upload in self.s3.open_uploads(self.prefix, self.show()) if abort_stale else ():
            if key in planned:
                with contextlib.suppress(OutputError):
                    self._call(
                        self.show(planned[key]),
                        client.abort_multipart_upload,
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload,
                    )
        clash: list[str] = []
        for key, size in self.s3.keys_below(self.prefix, self.show()).items():
            if key not in planned:
                continue
            head = self._call(
                self.show(planned[key]),
                client.head_object,
                Bucket=self.bucket,
                Key=key,
                ChecksumMode="ENABLED",
            )
            meta = head.get("Metadata") or {}
            mine = meta.get(META_JOB) == self.job
            proven = mine and proven_crc(head, meta.get(META_CRC)) is not None  # else: rewritten, never reused
            self.found(key, planned[key], size, mine, str(meta.get(META_CRC, "")) if proven else None, clash)
        self.refuse(clash)

    # -- the Destination protocol -----------------------------------------------------------------------

    def _upload(self, fd: int, size: int, crc: int, key: str, what: str) -> None:
        meta = {META_JOB: self.job, META_CRC: str(crc)}
        cond = {} if key in self._replaceable else {"IfNoneMatch": "*"}
        client = self.s3.client
        if size <= base_part():  # one request; its bytes count against the parts in memory too
            self._take_slot([])
            try:
                body = pread_all(fd, size, 0)
                self._call(
                    what,
                    client.put_object,
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    Metadata=meta,
                    ChecksumAlgorithm="CRC32",
                    ChecksumCRC32=crc_b64(crc),  # the store refuses the upload if its bytes differ
                    **cond,
                )
            finally:
                self._slots.release()
        else:
            self._multipart(fd, size, key, what, meta, cond | {"ChecksumCRC32": crc_b64(crc)})

    def _multipart(
        self, fd: int, size: int, key: str, what: str, meta: dict[str, str], cond: dict[str, str]
    ) -> None:
        client = self.s3.client
        up = self._call(
            what,
            client.create_multipart_upload,
            Bucket=self.bucket,
            Key=key,
            Metadata=meta,
            ChecksumAlgorithm="CRC32",
            ChecksumType="FULL_OBJECT",  # one CRC-32 of the whole object, as a single PUT has
        )
        uid = up.get("UploadId")
        if not isinstance(uid, str):
            raise OutputError(f"{what}: the store started no upload.", hint="Check AWS_ENDPOINT_URL.")
        with self._lock:
            self._open[key] = uid
        step = part_size(size)
        futures: list[Future[dict[str, Any]]] = []
        try:
            for number, offset in enumerate(range(0, size, step), 1):
                self._take_slot(futures)
                try:
                    self._check(futures)
                    data = pread_all(fd, min(step, size - offset), offset)
                except BaseException:
                    self._slots.release()
                    raise
                futures.append(self.pool().submit(self._part, what, key, uid, number, data))
            parts = [f.result() for f in futures]
            self._call(
                what,
                client.complete_multipart_upload,
                Bucket=self.bucket,
                Key=key,
                UploadId=uid,
                MultipartUpload={"Parts": parts},
                ChecksumType="FULL_OBJECT",
                **cond,
            )
        except BaseException:
            self.cancel_parts(futures)
            self._abort(key, uid)
            raise
        with self._lock:
            self._open.pop(key, None)

    def _part(self, what: str, key: str, uid: str, number: int, data: bytes) -> dict[str, Any]:
        try:
            if self.cancel.is_set():
                raise CancelledError("Conversion cancelled.")
            resp = self._call(
                what,
                self.s3.client.upload_part,
                Bucket=self.bucket,
                Key=key,
                UploadId=uid,
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="CRC32",
            )
            part = {"PartNumber": number, "ETag": resp["ETag"]}
            if isinstance(resp.get("ChecksumCRC32"), str):
                part["ChecksumCRC32"] = resp["ChecksumCRC32"]
            return part
        finally:
            self._slots.release()

    def cancel_parts(self, futures: list[Future[dict[str, Any]]]) -> None:
        for f in futures:
            if f.cancel():  # never started: the slot it held is given back here
                self._slots.release()
        for f in futures:  # none may still be uploading into an upload about to be aborted
            with contextlib.suppress(BaseException):
                f.exception()

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(upload_inflight(), thread_name_prefix="zi-upload")
            return self._pool

    # -- after the run ----------------------------------------------------------------------------------

    def _abort(self, key: str, uid: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the lifecycle rule is the backstop
            self.s3.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=uid)
        with self._lock:
            self._open.pop(key, None)

    def abandon(self) -> None:
        """After a failed, cancelled or interrupted run: abort what is still open and remove the objects this
        run made, so nothing of it stays visible (objects an earlier run of this job completed are kept)."""
        self.cancel.set()
        with self._lock:
            opened, made = list(self._open.items()), list(self.created)
        for key, uid in opened:
            self._abort(key, uid)
        for key in made:
            with contextlib.suppress(Exception):
                self.s3.client.delete_object(Bucket=self.bucket, Key=key)
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def crc_b64(crc: int) -> str:
    """A CRC-32 as S3 writes it: four bytes, big-endian, base64."""
    return base64.b64encode((crc & 0xFFFFFFFF).to_bytes(4, "big")).decode()


def proven_crc(head: dict[str, Any], recorded: object) -> int | None:
    """The CRC-32 an object's metadata records, when the store's own checksum of the object (computed by the
    store from the bytes it received, a whole-object CRC-32) is the same; None when either is missing, the
    store's is composite (a checksum of part checksums) or they differ."""
    if not isinstance(recorded, str) or not recorded.isdigit() or head.get("ChecksumType") == "COMPOSITE":
        return None
    stored = head.get("ChecksumCRC32")
    if not isinstance(stored, str) or "-" in stored:
        return None
    try:
        value = int.from_bytes(base64.b64decode(stored, validate=True), "big")
    except (binascii.Error, ValueError):
        return None
    return value if value == int(recorded) else None
