"""A DCP folder as a `Checkpoint`: the model's tensors with segments pointing at their chunks' bytes, Adam
moments from the optimizer's keys, the files and ranks, and findings for damage (missing files or items,
chunks that do not tile their tensor, items that are not what the metadata says)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from inspector.errors import InspectorError
from inspector.format.dtypes import FLOATING
from inspector.parse.dcp import DcpMetadata, Item, read_metadata
from inspector.scan.layouts.base import Found
from inspector.scan.layouts.dcp.found import METADATA, rank_of, refuse_hf_writer
from inspector.scan.layouts.dcp.items import Placed, read_scalar, refuse_transforms, try_place
from inspector.scan.layouts.dcp.keys import MOMENTS, SAVERS, Roles, optimizer_roles, roles_of
from inspector.scan.layouts.dcp.placement import Chunk, TilingError, runs
from inspector.scan.layouts.dcp.tied import tie
from inspector.scan.layouts.dcp.visit import Placements, visit
from inspector.scan.model import (
    Checkpoint,
    FileInfo,
    Finding,
    Kind,
    RankInfo,
    Runs,
    Segment,
    Severity,
    TensorInfo,
)
from inspector.scan.universal_needs import UniversalNeeds
from inspector.system.bytesource import ByteSource
from inspector.text import shown

_DAMAGED = "The folder is damaged or incomplete; copy the whole checkpoint folder again."
NOT_DEEPSPEED = (  # why the universal kind is not offered (`Checkpoint.universal.not_offered`)
    "a PyTorch Distributed Checkpoint, not a DeepSpeed run: a universal checkpoint is made from DeepSpeed's own "
    "ZeRO files (DCP folders already load on any world size with torch)"
)


@dataclass
class Store:
    """One DCP folder (Accelerate keeps the optimizer in a second one) and what reading it found."""

    source: ByteSource
    folder: str
    meta: DcpMetadata
    findings: list[Finding] = field(default_factory=list)
    used: set[str] = field(default_factory=set)  # files a tensor's chunks were read from
    missing: set[str] = field(default_factory=set)
    placements: Placements | None = None  # the items `visit` checked, file by file, before the key walk
    paths: dict[str, str] = field(default_factory=dict)  # each file's path, joined once

    def visit(self, keys: Iterable[str]) -> None:
        """Check the items of `keys` file by file (`visit.py`); `segments` then reads what they proved."""
        self.placements = visit(self.folder, self.source, self.meta, keys)

    def present(self, name: str) -> bool:
        if name in self.used:
            return True
        if name in self.missing:
            return False
        if self.source.is_file(os.path.join(self.folder, name)):
            self.used.add(name)
            return True
        self.missing.add(name)
        self.findings.append(
            Finding(
                Severity.ERROR,
                "missing-file",
                f"{shown(name)} is named by the metadata but is not in the folder: the chunks it holds are lost.",
                os.path.join(self.folder, name),
                _DAMAGED,
            )
        )
        return False

    def segments(self, key: str) -> tuple[Segment, ...] | None:
        """The key's bytes as segments, or None (with a finding) when they cannot all be found."""
        meta, tensor = self.meta, self.meta.tensors[key]
        quick = self.placements.rows(meta, key) if self.placements is not None else None
        if quick is not None and all(self.present(name) for name in dict.fromkeys(quick.names)):
            return self._laid(key, lambda: quick.segments(tensor.shape, tensor.dtype, self._path))
        chunks: list[Chunk] = []
        for row in meta.rows(key):
            offsets, sizes = meta.chunk(row)
            item = meta.item(row)
            if item is None or not self.present(item.file):
                if item is None and 0 not in sizes:
                    self._bad(key, f"its chunk at {list(offsets)} has no stored item")
                    return None
                if item is None:
                    chunks.append(Chunk(offsets, sizes, "", 0))
                    continue
                return None
            placed = self._placed(row, item, tensor.dtype, sizes)
            if isinstance(placed, InspectorError):
                self._bad(key, placed.message)
                return None
            chunks.append(Chunk(offsets, sizes, placed.file, placed.offset))
        return self._laid(key, lambda: runs(tensor.shape, tensor.dtype, chunks))

    def _laid(self, key: str, lay: Callable[[], Sequence[Segment]]) -> tuple[Segment, ...] | None:
        """The key's chunks as segments (`lay`) once they are proven to tile it (else None, with a finding)."""
        tensor = self.meta.tensors[key]
        try:
            laid = lay()
            # Runs: a Sequence[Segment] every consumer reads as the tuple it stands for (scan.tensor_lay)
            return laid if isinstance(laid, Runs) else tuple(laid)  # type: ignore[return-value]
        except TilingError as exc:
            self._bad(key, f"its chunks do not tile its shape {list(tensor.shape)}: {exc}")
            return None

    def _placed(self, row: int, item: Item, dtype: str, sizes: tuple[int, ...]) -> Placed | InspectorError:
        """What the visit proved of the row's item, or (not visited) its item checked now."""
        done = self.placements.get(row) if self.placements is not None else None
        if isinstance(done, int):
            return Placed(self._path(item.file), done)
        return done if done is not None else try_place(self.folder, self.source, item, dtype, sizes)

    def _path(self, name: str) -> str:
        path = self.paths.get(name)
        if path is None:
            path = self.paths[name] = os.path.join(self.folder, name)
        return path

    def _bad(self, key: str, why: str) -> None:
        self.findings.append(
            Finding(Severity.ERROR, "bad-chunks", f"{shown(key)}: {why}.", self.folder, _DAMAGED)
        )

    def step(self, key: str) -> int | None:
        """A 0-d `step` tensor's value."""
        meta = self.meta
        rows = meta.rows(key)
        item = meta.item(rows[0]) if len(rows) == 1 else None
        if item is None or not self.present(item.file):
            return None
        placed = try_place(self.folder, self.source, item, meta.tensors[key].dtype, ())
        value = (
            read_scalar(self.source, placed, meta.tensors[key].dtype) if isinstance(placed, Placed) else None
        )
        return int(value) if value is not None and value == value and abs(value) < 1 << 62 else None


def open_store(source: ByteSource, folder: str, names: tuple[str, ...]) -> Store:
    """A DCP folder's metadata read and checked; the folders this tool cannot read refused by name."""
    handle = source.open_handle(os.path.join(folder, METADATA))
    try:
        head = handle.pread(16, 0)
    finally:
        handle.close()
    refuse_hf_writer(folder, names, head)
    meta = read_metadata(folder, source)
    refuse_transforms(folder, meta.transforms)
    return Store(source, folder, meta)


def _optimizer_store(found: Found, roles: Roles) -> Store | None:
    """Accelerate's `optimizer_N/` beside `pytorch_model_fsdp_N/`."""
    base = os.path.basename(found.tag_dir.rstrip(os.sep))
    if roles.saver != "accelerate":
        return None
    folder = os.path.join(
        os.path.dirname(found.tag_dir.rstrip(os.sep)), "optimizer_" + base.rpartition("_")[2]
    )
    if not found.source.is_dir(folder):
        return None
    store = open_store(found.source, folder, tuple(found.source.listdir(folder)))
    optimizer_roles(store.meta, roles)
    return store


def scan_dcp(found: Found) -> Checkpoint:
    """The DCP folder `found.tag_dir` as a `Checkpoint` (metadata and each item's zip directory read; no
    tensor data)."""
    store = open_store(found.source, found.tag_dir, found.names)
    roles = roles_of(store.meta, found.tag_dir, found.names)
    opt = _optimizer_store(found, roles) or store
    moment_keys = [k for keys in roles.moments.values() for k in keys.values()]
    store.visit(list(roles.model.values()) + (moment_keys if opt is store else []))
    if opt is not store:
        opt.visit(moment_keys)
    tensors: list[TensorInfo] = []
    for fqn, key in roles.model.items():
        segs = store.segments(key)
        if segs is None:
            continue
        t = store.meta.tensors[key]
        moments = _moments(opt, roles.moments.get(fqn, {}))
        kind = _kind(t.dtype, bool(moments), bool(roles.moments))
        tensors.append(TensorInfo(fqn, t.shape, t.dtype, kind, segs, moments=moments))
    tensors, tied = tie(found.source, tensors, found.tag_dir)
    step = next((v for k in roles.steps.values() if (v := opt.step(k)) is not None), None)
    stores = [store] if opt is store else [store, opt]
    findings = [f for s in stores for f in s.findings] + _notes(stores, roles) + tied
    return _checkpoint(found, roles, stores, tensors, findings, step)


def _moments(opt: Store, keys: dict[str, str]) -> tuple[tuple[str, tuple[Segment, ...]], ...]:
    out = []
    for name in MOMENTS:
        if name in keys and (segs := opt.segments(keys[name])) is not None:
            out.append((name, segs))
    return tuple(out)


def _kind(dtype: str, has_moments: bool, optimizer_saved: bool) -> Kind:
    if has_moments:
        return Kind.TRAINABLE
    if dtype not in FLOATING:
        return Kind.BUFFER
    return Kind.FROZEN if optimizer_saved else Kind.TRAINABLE


def _notes(stores: list[Store], roles: Roles) -> list[Finding]:
    """What the folder holds beside the model, in words: bytes entries (never unpickled) and stray entries."""
    out = []
    entries = [b for s in stores for b in s.meta.bytes.values()]
    if entries:
        names = ", ".join(shown(b.key) for b in entries[:4]) + (", …" if len(entries) > 4 else "")
        size = sum(b.length for b in entries)
        out.append(
            Finding(
                Severity.INFO,
                "dcp-bytes",
                f"{len(entries)} pickled entries ({names}; {size:,} bytes) are kept as bytes, never unpickled.",
                stores[0].folder,
            )
        )
    for s in stores:
        if s.meta.duplicates or s.meta.strays:
            out.append(
                Finding(
                    Severity.WARNING,
                    "dcp-storage",
                    f"the metadata names {s.meta.duplicates} item(s) twice and {s.meta.strays} item(s) for no "
                    "chunk of their key; the first item of each chunk is read.",
                    s.folder,
                    _DAMAGED,
                )
            )
    return out


def _checkpoint(
    found: Found,
    roles: Roles,
    stores: list[Store],
    tensors: list[TensorInfo],
    findings: list[Finding],
    step: int | None,
) -> Checkpoint:
    files = [
        FileInfo.stat(
            os.path.join(s.folder, n), "model" if s is stores[0] else "optim", rank_of(n), 0, found.source
        )
        for s in stores
        for n in sorted(s.used)
    ]
    by_rank: dict[int, list[FileInfo]] = {}
    for f in files:
        by_rank.setdefault(f.dp_rank if f.dp_rank is not None else 0, []).append(f)
    ranks = [
        RankInfo(
            r,
            next((f.path for f in fs if f.role == "optim"), None),
            next((f.path for f in fs if f.role == "model"), None),
            sum(f.size for f in fs if f.role == "optim"),
            sum(f.size for f in fs if f.role == "model"),
            (),
        )
        for r, fs in sorted(by_rank.items())
    ]
    floats = Counter(t.dtype for t in tensors if t.dtype in FLOATING)
    compute = floats.most_common(1)[0][0] if floats else "float32"
    master = next((s[0].dtype for t in tensors for _, s in t.moments if s), compute)
    tag = found.tag or os.path.basename(found.tag_dir.rstrip(os.sep))
    return Checkpoint(
        root=found.root,
        tag=tag,
        tags=found.tags or (tag,),  # the saves beside it, as locating listed them
        tag_dir=found.tag_dir,
        layout=f"dcp-{roles.saver}",
        stage=3,
        world_size=len(ranks),
        optimizer="Adam (torch, DCP)" if roles.moments else "none saved",
        compute_dtype=compute,
        master_dtype=master,
        deepspeed_version=None,
        global_steps=step,
        global_samples=None,
        optimizer_step=step,
        loss_scale=None,
        dynamic_loss_scale=None,
        files=tuple(files),
        ranks=tuple(ranks),
        groups=(),
        tensors=tuple(tensors),
        findings=tuple(findings),
        universal=UniversalNeeds(not_offered=NOT_DEEPSPEED),
        saved_by=SAVERS.get(roles.saver, SAVERS["torch"]),
    )
