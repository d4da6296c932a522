"""What every store's output prefix shares, whatever the client: the `Destination` an OutputRoot publishes
through when OUT is a bucket prefix.

`destination_for` builds the one for a URL's scheme from the scheme table (`remote.backend.SCHEMES`, its
`destination` column): `s3://` in `remote.upload` (boto3), `gs://` and `az://` in `remote.cloud_upload`
(obstore). `PrefixDestination` holds what they share: the prefix, its keys (each name under the one name
rule, so nothing leads out of it), the clash refusal, the parts in memory (ZI_S3_UPLOAD_INFLIGHT, default 4,
for the whole run), the part size, and the record of what this run made and what an earlier run of the same
job completed (reused only when its CRC-32 is proven, never on metadata alone).
"""

from __future__ import annotations

import importlib
import os
import threading
from concurrent.futures import Future
from typing import Any

from inspector.errors import CancelledError, OutputError
from inspector.parse.names import name_problem
from inspector.remote.backend import int_env, normalise_url, scheme_row, split_url
from inspector.remote.store import Store, store_for
from inspector.text import quoted, shown

PART = 16 << 20  # the default part; ZI_S3_PART_MIB sets another (5 MiB, S3's smallest, to 512 MiB)
MAX_PARTS = 10_000  # S3's limit per upload


def require_writable(url: str) -> None:
    """Refuse an OUT on a store no destination writes (the scheme table's `writable`: fsspec URLs are read
    only)."""
    name, _, _ = url.partition("://")
    if not scheme_row(name).writable or "://" not in url:
        raise OutputError(
            f"{shown(url)}: an output can be a local folder or an s3://, gs:// or az:// prefix.",
            hint="Convert into a local folder and copy it with the store's own tool.",
            title="Unsupported output",
        )


def destination_for(url: str, job: str, overwrite: bool, cancel: threading.Event | None = None) -> Any:
    """The output `Destination` for a bucket prefix, of the class its scheme's row names."""
    url = normalise_url(url)
    require_writable(url)
    module, _, name = scheme_row(url.partition("://")[0]).destination.partition(":")
    return getattr(importlib.import_module(module), name)(url, job, overwrite, cancel)


def upload_inflight() -> int:
    """Parts uploaded (and held in memory) at once for the whole run (ZI_S3_UPLOAD_INFLIGHT, 1..32, default 4)."""
    return int_env("ZI_S3_UPLOAD_INFLIGHT", 4, 1, 32)


def base_part() -> int:
    return int_env("ZI_S3_PART_MIB", PART >> 20, 5, 512) << 20


def part_size(size: int) -> int:
    """The part size (16 MiB), or the next MiB above size / 10,000 for a file that would need more parts than
    S3 allows."""
    need = -(-size // MAX_PARTS)
    return max(base_part(), -(-need // (1 << 20)) << 20)


class PrefixDestination:
    """What every store's output prefix shares: the prefix, its keys (each name under the one name rule),
    the clash refusal, and the record of what this run made and what an earlier run of the job completed.
    Thread-safe: the universal writer publishes from several threads, which share the parts in flight."""

    def __init__(self, url: str, job: str, overwrite: bool, cancel: threading.Event | None = None) -> None:
        self.url = normalise_url(url)
        require_writable(self.url)
        self.scheme, bucket, parts = split_url(self.url)
        self.bucket = bucket
        self.prefix = "".join(p + "/" for p in parts)
        self.job = job
        self.overwrite = overwrite
        self.cancel = cancel or threading.Event()
        self.store: Store = store_for(self.scheme, bucket)
        self.created: list[str] = []  # keys this run made visible, in order
        self.reused: list[str] = []  # names an earlier run of this job had already completed
        self.sizes: dict[str, int] = {}
        self._ours: dict[str, tuple[int, str]] = {}  # key -> (size, crc) of objects this job wrote before
        self._replaceable: set[str] = set()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(upload_inflight())

    # -- names ------------------------------------------------------------------------------------------

    def key(self, rel: str) -> str:
        parts = [p for p in rel.split("/") if p]
        if not parts or any(name_problem(p) for p in parts):  # the root checked it already; checked again
            raise OutputError(
                f"Refusing to upload {quoted(rel, None)}: not a plain name.", title="Unsafe output name"
            )
        return self.prefix + "/".join(parts)

    def show(self, rel: str = "") -> str:
        return shown(f"{self.url}/{rel}" if rel else self.url)

    def refuse(self, clash: list[str]) -> None:
        """Objects of someone else's at planned keys, without --overwrite: the run does not start."""
        if clash:
            listed = ", ".join(shown(n) for n in clash[:5]) + (" …" if len(clash) > 5 else "")
            raise OutputError(
                f"{self.show()} already holds {listed}.",
                hint="Choose another prefix, or pass --overwrite to replace the objects this conversion writes "
                "(others under the prefix are left alone).",
                title="Output not empty",
            )

    def found(self, key: str, rel: str, size: int, mine: bool, proven: str | None, clash: list[str]) -> None:
        """`check`'s verdict on an object already at a planned key: this job's (`mine`) may be replaced and is
        reused only with its CRC-32 `proven` (else rewritten); someone else's is replaced with --overwrite
        and otherwise joins `clash` (named by `rel`), which `refuse` turns down."""
        if mine:
            if proven is not None:
                self._ours[key] = (size, proven)
            self._replaceable.add(key)
        elif self.overwrite:
            self._replaceable.add(key)
        else:
            clash.append(rel)

    def holds(self, rel: str, size: int | None) -> bool:
        """Whether an earlier run of this very job completed `rel` (with `size` bytes, when given): a writer
        may skip it, since an object exists whole or not at all and this job's bytes are fixed by its plan.
        That run may be a `--part` of the job (the identity has no part in it): its objects are what the
        finishing run reuses. Told by what `check` proved (the listed size, and a CRC-32 the store or a
        reading of the object confirmed); the size a writer reports for it is the listing's."""
        found = self._ours.get(self.key(rel))
        if found is None or (size is not None and found[0] != size) or not found[1].isdigit():
            return False  # an object of ours without its CRC-32 was not finished by this code: rewritten
        self._reuse(rel, found[0])
        return True

    def _reuse(self, rel: str, size: int) -> None:
        """`rel` stays as an earlier run of this job left it (`size` bytes): counted, not uploaded."""
        with self._lock:
            self.reused.append(rel)
            self.sizes[rel] = size

    def publish(self, fd: int, size: int, crc: int, rel: str) -> None:
        """Upload the finished file `rel` (`size` bytes, CRC-32 `crc`, open at `fd`) under its key; an object
        an earlier run of this job uploaded with these very bytes is kept, not sent again."""
        key = self.key(rel)
        if self._ours.get(key) == (size, str(crc)):
            self._reuse(rel, size)
            return
        if self.cancel.is_set():
            raise CancelledError("Conversion cancelled.")
        self._upload(fd, size, crc, key, self.show(rel))
        self._made(key, rel, size)

    def _upload(self, fd: int, size: int, crc: int, key: str, what: str) -> None:
        """The store's own upload of one file (its client, conditions and metadata)."""
        raise NotImplementedError

    def _made(self, key: str, rel: str, size: int) -> None:
        with self._lock:
            self.created.append(key)
            self.sizes[rel] = size

    def _take_slot(self, futures: list[Future[dict[str, Any]]]) -> None:
        """Wait for room: at most `upload_inflight()` parts are held in memory, for all files together."""
        while not self._slots.acquire(timeout=0.1):
            self._check(futures)

    def _check(self, futures: list[Future[dict[str, Any]]]) -> None:
        if self.cancel.is_set():
            raise CancelledError("Conversion cancelled.")
        for f in futures:
            if f.done() and (exc := f.exception()) is not None:
                raise exc

    def size_of(self, rel: str) -> int | None:
        with self._lock:
            return self.sizes.get(rel)


def pread_all(fd: int, n: int, offset: int) -> bytes:
    """Exactly `n` bytes of the staged file at `offset` (it is ours and complete: short is our bug)."""
    chunks, got = [], 0
    while got < n:
        data = os.pread(fd, n - got, offset + got)
        if not data:
            raise OutputError("Internal error: a staged file is shorter than it was a moment ago.")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)
