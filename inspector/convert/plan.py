"""Turn a scanned checkpoint and the user's choices into a frozen ConversionPlan: pure, no I/O.

The plan fixes every output byte before anything is written: which shard each tensor goes to, its byte
offset there, every safetensors header, the index, and the buffers the executor will allocate. Which
tensors, under which names and dtypes, is decided first by `options`; this module only lays them out.
Tests check plans without touching disk; a kind's job carries one out on the one executor
(`executor.run`); `preflight` predicts from one.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field

from inspector.convert.options import SOURCES, ConvertOptions, Named, check_inputs, name_tensors
from inspector.format.dtypes import SAFETENSORS_CODES, itemsize
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.scan.slices import segments_nbytes
from inspector.system.bytesource import ByteSource, any_remote

SAFETENSORS_DTYPES = SAFETENSORS_CODES
PIPELINE_DEPTH = 3  # chunks in flight per stage (read / convert / write)
# From an object store every chunk's read is a round trip, and a tensor smaller than a chunk is one request:
# chunks a quarter the size and 8 of them per stage keep the requests in flight going where 3 would wait on
# their latency, in two thirds of the local buffer bytes (measured: 12 were no faster, and 14 MiB larger).
REMOTE_SPLIT = 4
REMOTE_DEPTH = 8
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"  # --adapter: PEFT's file name
META_KEY = "zero_inspector"


@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor: where it comes from, what it becomes, where its bytes go."""

    name: str
    source: str
    kind: Kind
    shape: tuple[int, ...]
    src_dtype: str
    out_dtype: str
    segments: tuple[Segment, ...]
    offset: int  # within the shard's data section
    nbytes: int

    @property
    def numel(self) -> int:
        return self.nbytes // itemsize(self.out_dtype)


@dataclass(frozen=True)
class PlannedShard:
    filename: str
    tensors: tuple[PlannedTensor, ...]
    header: bytes  # 8-byte length + JSON, padded; data starts right after
    data_bytes: int

    @property
    def file_bytes(self) -> int:
        return len(self.header) + self.data_bytes

    @functools.cached_property
    def read_bytes(self) -> int:
        """Bytes read for this shard (a stage-3 parameter's slices counted, never listed: 1.3 M of them
        for a small model on 1,024 ranks)."""
        return sum(segments_nbytes(t.segments) for t in self.tensors)

    @functools.cached_property
    def _largest(self) -> int:
        """Bytes of the largest tensor here, in the wider of its two dtypes: computed once per shard
        (`chunk_elems` asks per tensor; recomputed each time, a shard of n tensors cost n^2)."""
        return max(
            (t.numel * max(itemsize(t.src_dtype), itemsize(t.out_dtype)) for t in self.tensors), default=16
        )

    def buffer_size(self, limit: int) -> int:
        """Bytes of one source buffer: `limit` fp32 elements, or less when every tensor here is smaller.

        Sized in bytes, not elements, so one int64 scalar does not double the pool."""
        return max(16, min(limit * 4, self._largest))

    def chunk_elems(self, tensor: PlannedTensor, limit: int) -> int:
        """Elements of `tensor` per chunk, so that both its source and its output slice fit a buffer."""
        return max(1, self.buffer_size(limit) // max(itemsize(tensor.src_dtype), itemsize(tensor.out_dtype)))

    def out_buffer_size(self, limit: int) -> int:
        """Bytes of one output buffer (0 when nothing here changes dtype: bytes go straight to disk)."""
        casts = [t for t in self.tensors if t.out_dtype != t.src_dtype]
        return max((self.chunk_elems(t, limit) * itemsize(t.out_dtype) for t in casts), default=0)

    def buffer_bytes(self, limit: int) -> int:
        """Everything the executor's pools hold for this shard."""
        return PIPELINE_DEPTH * (self.buffer_size(limit) + self.out_buffer_size(limit))


@dataclass(frozen=True)
class ConversionPlan:
    """Everything `execute` will do, decided up front."""

    source: str
    tag: str
    stage: int
    world_size: int
    options: ConvertOptions
    shards: tuple[PlannedShard, ...]
    index: bytes | None  # model.safetensors.index.json content, or None for a single file
    aliases: dict[str, str] = field(default_factory=dict)  # deduped tied names -> stored owner
    fingerprint: str = ""
    read_bytes_by_source: dict[str, int] = field(default_factory=dict)  # what each --source would read
    sources: tuple[ByteSource, ...] = ()  # the folders every segment is read through (checkpoint, base model)
    model_parallel: str = ""  # the checkpoint's model-parallel layout ("pipeline", "expert", "tensor"), if any
    # what scanning the checkpoint cost here (`Checkpoint.scan_cpu`): part of the run's start-up
    scan_cpu: float = field(default=0.0, compare=False)

    @property
    def output_bytes(self) -> int:
        return sum(s.file_bytes for s in self.shards) + (len(self.index) if self.index else 0)

    @property
    def tensor_bytes(self) -> int:
        return sum(s.data_bytes for s in self.shards)

    @property
    def read_bytes(self) -> int:
        return sum(s.read_bytes for s in self.shards)

    @property
    def tensor_count(self) -> int:
        return sum(len(s.tensors) for s in self.shards)

    @property
    def remote(self) -> bool:
        """Whether any byte is read from an object store (`sources` are what every segment is read through)."""
        return any_remote(self.sources)

    @property
    def depth(self) -> int:
        """Chunks in flight per stage: PIPELINE_DEPTH, or REMOTE_DEPTH from an object store."""
        return REMOTE_DEPTH if self.remote else PIPELINE_DEPTH

    @property
    def chunk_limit(self) -> int:
        """Elements per chunk: the option's, a REMOTE_SPLIT-th of it from an object store."""
        return max(1, self.options.chunk_elems // (REMOTE_SPLIT if self.remote else 1))

    @property
    def buffer_bytes(self) -> int:
        """Bytes of chunk buffers the executor allocates, once per run (source + output buffers in flight)."""
        src, out = self.pool_sizes
        return self.depth * (src + out)

    @property
    def pool_sizes(self) -> tuple[int, int]:
        """(source, output) buffer sizes that fit every shard; allocated once so memory does not creep with
        the shard count (re-allocating 16 MiB blocks per shard raises glibc's mmap threshold)."""
        limit = self.chunk_limit
        return (
            max((s.buffer_size(limit) for s in self.shards), default=16),
            max((s.out_buffer_size(limit) for s in self.shards), default=0),
        )

    @property
    def filenames(self) -> list[str]:
        return [s.filename for s in self.shards] + ([INDEX_NAME] if self.index else [])


def _header(tensors: list[PlannedTensor], metadata: dict[str, str]) -> bytes:
    body: dict[str, object] = {"__metadata__": metadata}
    for t in tensors:
        body[t.name] = {
            "dtype": SAFETENSORS_DTYPES[t.out_dtype],
            "shape": list(t.shape),
            "data_offsets": [t.offset, t.offset + t.nbytes],
        }
    raw = json.dumps(body, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header so data starts 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw


def source_segments(t: TensorInfo, out_dtype: str, source: str) -> tuple[Segment, ...]:
    """Where `t`'s output bytes come from. `module` takes the 16-bit module copy (2 bytes/param to read,
    no cast) when the output is in its dtype; anything else, and every tensor without one, reads `segments`."""
    if source == "module" and t.module_copy and t.module_copy[0].dtype == out_dtype:
        return t.module_copy
    return t.segments


def _fingerprint(ckpt: Checkpoint, opts: ConvertOptions) -> str:
    """Identifies source + options, so a resumed run only reuses shards of the same job."""
    h = hashlib.sha256()
    h.update(f"{ckpt.tag_dir}|{ckpt.tag}|{opts!r}".encode())
    for f in ckpt.files:
        h.update(f"{f.path}|{f.size}|{f.mtime_ns}".encode())
    return h.hexdigest()[:16]


def _group_shards(planned: list[Named], shard_size: int) -> list[list[Named]]:
    """Fill shards in order, starting a new one when the next tensor would pass `shard_size`."""
    shards_tensors: list[list[Named]] = [[]]
    size = 0
    for item in planned:
        nbytes = item[0].numel * itemsize(item[2])
        if shards_tensors[-1] and size + nbytes > shard_size:
            shards_tensors.append([])
            size = 0
        shards_tensors[-1].append(item)
        size += nbytes
    return shards_tensors


def _metadata(
    ckpt: Checkpoint,
    opts: ConvertOptions,
    fingerprint: str,
    planned: list[Named],
    chosen: list[TensorInfo],
    aliases: dict[str, str],
    alias_sources: dict[str, str],
) -> dict[str, str]:
    """The `__metadata__` every shard header carries."""
    return {
        "format": "pt",
        META_KEY: json.dumps(
            {
                "source_tag": ckpt.tag,
                "stage": ckpt.stage,
                "world_size": ckpt.world_size,
                "job": fingerprint,
                "renamed": {
                    **{n: t.name for t, n, _ in planned if n != t.name},
                    **{a: src for a, src in alias_sources.items() if a != src},  # verify maps them back
                },
                "filtered": len(chosen) != len(ckpt.tensors),
                "source": opts.source,
                **({"aliases": aliases} if aliases else {}),
            },
            separators=(",", ":"),
        ),
    }


def _lay_out_shards(
    shards_tensors: list[list[Named]], meta: dict[str, str], source: str
) -> tuple[list[PlannedShard], dict[str, str]]:
    """Name each shard, place its tensors and build its header; also the weight map (name -> file)."""
    n = len(shards_tensors)
    shards = []
    weight_map: dict[str, str] = {}
    for i, group in enumerate(shards_tensors):
        filename = SINGLE_NAME if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensors, off = [], 0
        for t, name, dtype in group:
            nbytes = t.numel * itemsize(dtype)
            segs = source_segments(t, dtype, source)
            src_dtype = segs[0].dtype if segs else t.dtype
            tensors.append(PlannedTensor(name, t.name, t.kind, t.shape, src_dtype, dtype, segs, off, nbytes))
            off += nbytes
            weight_map[name] = filename
        shards.append(PlannedShard(filename, tuple(tensors), _header(tensors, meta), off))
    return shards, weight_map


def build_plan(ckpt: Checkpoint, opts: ConvertOptions, *, allow_damaged: bool = False) -> ConversionPlan:
    """Decide every output byte. Raises InspectorError for choices that cannot work."""
    out_dtype, chosen = check_inputs(ckpt, opts, allow_damaged)
    planned, aliases, alias_sources = name_tensors(chosen, opts, out_dtype)
    shards_tensors = _group_shards(planned, opts.shard_size)
    fingerprint = _fingerprint(ckpt, opts)
    meta = _metadata(ckpt, opts, fingerprint, planned, chosen, aliases, alias_sources)
    by_source = {
        src: sum(segments_nbytes(source_segments(t, dtype, src)) for t, _, dtype in planned)
        for src in SOURCES
    }
    shards, weight_map = _lay_out_shards(shards_tensors, meta, opts.source)
    index = None
    if len(shards_tensors) > 1:
        index = (
            json.dumps(
                {"metadata": {"total_size": sum(s.data_bytes for s in shards)}, "weight_map": weight_map},
                indent=2,
            )
            + "\n"
        ).encode()
    return ConversionPlan(
        ckpt.root,
        ckpt.tag,
        ckpt.stage,
        ckpt.world_size,
        opts,
        tuple(shards),
        index,
        aliases,
        fingerprint,
        by_source,
        (ckpt.source,),
        ckpt.parallel.kind if ckpt.parallel else "",
        ckpt.scan_cpu,
    )
