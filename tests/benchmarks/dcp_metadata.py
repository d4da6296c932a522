"""How much memory and time reading a big DCP `.metadata` costs: ours (streaming into arrays) against torch's
own unpickling of the same file.

    PYTHONPATH=. python tests/benchmarks/dcp_metadata.py [--items 1000000] [--file /tmp/dcp_bench/.metadata]

The synthetic metadata is written opcode by opcode in the shape Python's pickler gives torch's classes
(`Metadata`, `TensorStorageMetadata`, `ChunkStorageMetadata`, `MetadataIndex`, `_StorageInfo`; torch's own
pickling of 10^6 items takes over 10 minutes here; `--check` unpickles the file with torch's classes), as on
real saves: `torch.Size` through TUPLE1-3, `MetadataIndex`'s state in its `__init__`'s order (fqn, index,
offset) and each entry's fqn a string object of its own (gathered from the ranks), so written again: tensors
of shape (4096, 4096) fp32 in row slabs over `ranks` ranks, three keys per parameter (weight, exp_avg,
exp_avg_sq), one storage entry per chunk. Each measurement runs in a fresh interpreter and reports its peak
RSS (VmHWM), wall time and CPU time (on a shared machine compare CPU seconds). Figures go in results.md;
nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import time
from typing import Any

_DCP = "torch.distributed.checkpoint.metadata"

_OURS = """
import sys, time
from inspector.system.source import Source
from inspector.parse.dcp import read_metadata
t, c = time.perf_counter(), time.process_time()
folder = sys.argv[1]
meta = read_metadata(folder, Source(folder))
took, cpu = time.perf_counter() - t, time.process_time() - c
hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]
print(f"ours: {len(meta.tensors)} keys, {len(meta.starts)} chunks, {took:.1f} s ({cpu:.2f} CPU-s), "
      f"peak RSS {int(hwm) // 1024} MiB")
"""

_TORCH = """
import sys, time, pickle
import torch.distributed.checkpoint  # the classes the pickle names
t, c = time.perf_counter(), time.process_time()
with open(sys.argv[1] + '/.metadata', 'rb') as f:
    meta = pickle.load(f)
took, cpu = time.perf_counter() - t, time.process_time() - c
hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]
print(f"torch pickle.load: {len(meta.state_dict_metadata)} keys, {took:.1f} s ({cpu:.2f} CPU-s), "
      f"peak RSS {int(hwm) // 1024} MiB"
      " (torch imported: ~300 MiB of it)")
"""


class _Emitter:
    """Pickle opcodes (protocol 4) in the shape Python's pickler writes a DCP `Metadata`: every object
    memoized, strings and globals referred back to. Streams to the file, so 10^6 items take no memory."""

    def __init__(self, f: Any) -> None:
        self.f, self.memo, self.n, self.parts = f, {}, 0, []

    def op(self, b: bytes) -> None:
        self.parts.append(b)
        if len(self.parts) > 4096:
            self.flush()

    def flush(self) -> None:
        self.f.write(b"".join(self.parts))
        self.parts = []

    def memoize(self, key: Any = None) -> None:
        self.op(b"\x94")
        if key is not None:
            self.memo[key] = self.n
        self.n += 1

    def get(self, key: Any) -> bool:
        if key not in self.memo:
            return False
        i = self.memo[key]
        self.op(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))
        return True

    def str(self, text: str) -> None:
        if not self.get(("s", text)):
            raw = text.encode()
            self.op(
                (b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + struct.pack("<I", len(raw))) + raw
            )
            self.memoize(("s", text))

    def glob(self, module: str, name: str) -> None:
        if not self.get(("g", module, name)):
            self.str(module)
            self.str(name)
            self.op(b"\x93")
            self.memoize(("g", module, name))

    def int(self, v: int) -> None:
        if v < 256:
            self.op(b"K" + bytes([v]))
        elif v < 65536:
            self.op(b"M" + struct.pack("<H", v))
        elif v < 2**31:
            self.op(b"J" + struct.pack("<i", v))
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            self.op(b"\x8a" + bytes([len(raw)]) + raw)

    def fresh(self, text: str) -> None:
        """A string object not seen before (same text or not): written out and memoized again."""
        raw = text.encode()
        self.op((b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + struct.pack("<I", len(raw))) + raw)
        self.memoize()

    def size(self, dims: tuple[int, ...]) -> None:
        """torch.Size as `__reduce__` gives it: (Size, (tuple,)); a tuple of 1-3 by TUPLE1-3, as the pickler."""
        self.glob("torch", "Size")
        if not dims:
            self.op(b")")
        else:
            self.op(b"(" if len(dims) > 3 else b"")
            for d in dims:
                self.int(d)
            self.op(b"t" if len(dims) > 3 else bytes([0x84 + len(dims)]))
            self.memoize()
        self.op(b"\x85")
        self.memoize()
        self.op(b"R")
        self.memoize()

    def reduced(self, module: str, name: str, arg: Any) -> None:
        """A value pickled as a call (layout, memory format): the same object referred back to after."""
        if not self.get(("r", name)):
            self.glob(module, name)
            self.str(arg) if isinstance(arg, str) else self.int(arg)
            self.op(b"\x85")
            self.memoize()
            self.op(b"R")
            self.memoize(("r", name))

    def record(self, cls: str, fields: list[tuple[str, Any]], module: str = _DCP) -> None:
        self.glob(module, cls)
        self.op(b")\x81")
        self.memoize()
        self.op(b"}")
        self.memoize()
        self.op(b"(")
        for k, v in fields:
            self.str(k)
            v()
        self.op(b"ub")


def write(path: str, items: int, ranks: int) -> None:
    """A `.metadata` of `items` storage entries (and as many chunks), in `ranks` row slabs per key."""
    rows, per = 4096, 4096 // ranks
    names = [
        f"model.layers.{k // 3}.mlp.weight"
        if k % 3 == 0
        else f"optim.state.layers.{k // 3}.mlp.weight.exp_avg{'_sq' * (k % 3 == 2)}"
        for k in range(max(1, items // ranks))
    ]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        w = _Emitter(f)
        w.op(b"\x80\x04")
        w.glob(_DCP, "Metadata")
        w.op(b")\x81")
        w.memoize()
        w.op(b"}")
        w.memoize()
        w.op(b"(")
        w.str("state_dict_metadata")
        w.op(b"}")
        w.memoize()
        for batch in range(0, len(names), 1000):
            w.op(b"(")
            for name in names[batch : batch + 1000]:
                w.str(name)
                w.record("TensorStorageMetadata", [
                    ("properties", lambda: _properties(w)),
                    ("size", lambda: w.size((rows, rows))),
                    ("chunks", lambda: _chunks(w, ranks, per, rows)),
                ])  # fmt: skip
            w.op(b"u")
        w.str("planner_data")
        w.op(b"}")
        w.memoize()
        w.op(b"(")
        for name in names:
            w.str(name)
            head, _, tail = name.partition(".")
            w.str(head)
            w.str(tail)
            w.op(b"\x86")
            w.memoize()
        w.op(b"u")
        _storage(w, names, ranks, per, rows)
        w.str("storage_meta")
        w.op(b"N")
        w.str("version")
        w.str("1.0.0")
        w.op(b"ub.")
        w.flush()


def _storage(w: _Emitter, names: list[str], ranks: int, per: int, rows: int) -> None:
    """`storage_data`: one `MetadataIndex -> _StorageInfo` entry per chunk."""
    w.str("storage_data")
    w.op(b"}")
    w.memoize()
    for k, name in enumerate(names):
        w.op(b"(")
        for r in range(ranks):
            w.record("MetadataIndex", [
                ("fqn", lambda name=name: w.fresh(name)),
                ("index", lambda r=r: w.int(r)),
                ("offset", lambda r=r: w.size((r * per, 0))),
            ])  # fmt: skip
            w.record("_StorageInfo", [
                ("relative_path", lambda r=r: w.str(f"__{r}_0.distcp")),
                ("offset", lambda k=k: w.int(k * per * rows * 4)),
                ("length", lambda: w.int(per * rows * 4 + 1500)),
            ], "torch.distributed.checkpoint.filesystem")  # fmt: skip
        w.op(b"u")


def _properties(w: _Emitter) -> None:
    w.glob(_DCP, "TensorProperties")
    w.op(b")\x81")
    w.memoize()
    w.op(b"(")
    w.glob("torch", "float32")
    w.reduced("torch.serialization", "_get_layout", "torch.strided")
    w.op(b"\x89")
    w.reduced(_DCP, "_MEM_FORMAT_ENCODING", 0)
    w.op(b"\x89t")
    w.memoize()
    w.op(b"b")


def _chunks(w: _Emitter, ranks: int, per: int, rows: int) -> None:
    w.op(b"]")
    w.memoize()
    w.op(b"(")
    for r in range(ranks):
        w.record(
            "ChunkStorageMetadata",
            [("offsets", lambda r=r: w.size((r * per, 0))), ("sizes", lambda: w.size((per, rows)))],
        )
    w.op(b"e")


def check(folder: str) -> None:
    """The emitted pickle is what torch's classes unpickle from (run once with a small --items)."""
    import pickle

    import torch.distributed.checkpoint  # noqa: F401  (the classes the pickle names)

    with open(os.path.join(folder, ".metadata"), "rb") as f:
        meta = pickle.load(f)
    n = sum(len(t.chunks) for t in meta.state_dict_metadata.values())
    print(f"torch reads it: {len(meta.state_dict_metadata)} keys, {n} chunks, {len(meta.storage_data)} items")


def run(code: str, folder: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", code, folder], capture_output=True, text=True, env=env, check=False
    )
    print(out.stdout.strip() or out.stderr.strip()[-2000:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--file", default="/tmp/dcp_bench/.metadata")
    ap.add_argument("--skip-torch", action="store_true", help="measure ours only")
    ap.add_argument("--check", action="store_true", help="unpickle the file with torch's classes first")
    args = ap.parse_args()
    if not os.path.exists(args.file):
        t = time.perf_counter()
        write(args.file, args.items, args.ranks)
        print(
            f"wrote {args.file}: {os.path.getsize(args.file) / 2**20:.0f} MiB in {time.perf_counter() - t:.0f} s"
        )
    folder = os.path.dirname(args.file)
    if args.check:
        check(folder)
    run(_OURS, folder)
    if not args.skip_torch:
        run(_TORCH, folder)


if __name__ == "__main__":
    main()
