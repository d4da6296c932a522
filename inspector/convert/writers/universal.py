"""Write a DeepSpeed universal checkpoint straight from a ZeRO checkpoint: plan as data, then stream.

Layout (FORMAT.md §4): `OUT/<tag>_uni/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt` as
`{'param': fp32 tensor in full shape, 'cat_dim': 0}`, a `step.pt` per parameter for stage 1/2, one
`zero/optimizer_state.pt` with the global optimizer state and hyperparameters, byte copies of the
model-states files, and `OUT/latest_universal` naming the folder. Every parameter is rebuilt from
`param_shapes` (so round-robin and aligned layouts come out right, unlike `ds_to_universal`) and streamed
chunk by chunk from the rank files into its `.pt` file: no temporary per-rank fragments, flat memory.

Output is atomic and resumable: OUT is locked for the run (`output.FolderLock`, as for safetensors), files
go to `OUT/<tag>_uni.partial/`, each written whole or not at all;
a rerun of the same job keeps the finished ones; the folder is renamed when complete, `latest_universal`
last. No torch here: `.pt` files come from `format.ptwriter`, fed with raw bytes.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.convert.writers.universal_journal import JOURNAL, Journal, finished_files, inside, reusable
from inspector.errors import CancelledError, DamagedCheckpointError, OutputError, UnsupportedCheckpointError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Checkpoint, Kind, Segment
from inspector.system.source import Source, open_in

STATES = ("fp32", "exp_avg", "exp_avg_sq")
CHUNK_BYTES = 16 << 20
# zip entries, pickle and directory of one `.pt` file: measured 1,784 B + 7 B per character of the state name
# (each of the 7 entries repeats it twice) within 64 B of alignment; a step.pt ~1,760 B
FILE_OVERHEAD = 1_784
SMALL_FILE = 1_760
OPTIMIZER_STATE_ESTIMATE = 4_096
PARTIAL = ".partial"
SOURCE_STAMP = ".zero_inspector_source.json"
LATEST = "latest_universal"


@dataclass(frozen=True, slots=True)
class UniFile:
    """One per-parameter `.pt` file: `{'param': <shape> tensor, 'cat_dim': 0}` streamed from `segments`."""

    rel: str  # path inside the universal folder, e.g. "zero/l1.weight/exp_avg.pt"
    name: str
    state: str
    shape: tuple[int, ...]
    source_dtype: str
    segments: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * 4  # written as fp32


@dataclass(frozen=True, slots=True)
class UniversalPlan:
    """Everything the writer will do, fixed before any byte is written."""

    out_root: str
    folder: str  # "<tag>_uni"
    stage: int
    files: tuple[UniFile, ...]
    step_params: tuple[tuple[str, int], ...]  # stage 1/2: (param name, group) -> zero/<name>/step.pt
    copies: tuple[tuple[str, str], ...]  # (source path, name in the folder): model-states files
    optim_file: str  # rank 0's optimizer file: global state, hyperparameters and steps
    source: tuple[tuple[str, int, int], ...]  # (path, size, mtime_ns) of every source file
    sources: tuple[Source, ...] = ()  # the folders the source files are read through

    @property
    def out_dir(self) -> str:
        return os.path.join(self.out_root, self.folder)

    @property
    def tensor_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    @property
    def file_count(self) -> int:
        """Every file the export writes (tensor states, step counts, optimizer state, model-states copies)."""
        return sum(1 for _ in iter_rel_paths(self))

    @property
    def total_bytes(self) -> int:
        copies = sum(os.path.getsize(src) for src, _ in self.copies)
        overhead = sum(FILE_OVERHEAD + 7 * len(f.state) for f in self.files)
        small = len(self.step_params) * SMALL_FILE + OPTIMIZER_STATE_ESTIMATE
        return self.tensor_bytes + copies + overhead + small


def plan_universal(ckpt: Checkpoint, out_root: str, folder: str | None = None) -> UniversalPlan:
    """Pure: which files, from which bytes. Frozen params get an fp32 copy (as ds_to_universal's stage-1/2
    path writes); buffers and tied aliases live in the copied model-states files."""
    if ckpt.errors:
        raise DamagedCheckpointError(
            f"{ckpt.tag_dir} has {len(ckpt.errors)} error(s); see `zero-inspector scan`.",
            hint="A universal checkpoint written from a damaged source would resume wrong.",
        )
    files: list[UniFile] = []
    steps: list[tuple[str, int]] = []
    for t in ckpt.tensors:
        if t.kind is Kind.TRAINABLE:
            moments = dict(t.moments)
            if set(moments) != {"exp_avg", "exp_avg_sq"}:
                raise UnsupportedCheckpointError(
                    f"{t.name} has no Adam moments (exp_avg, exp_avg_sq) in the optimizer state.",
                    hint="Universal checkpoints are written for Adam-family optimizers only.",
                )
            for state, segs in (("fp32", t.segments), *((m, moments[m]) for m in STATES[1:])):
                files.append(_file(t.name, state, t.shape, segs))
            if ckpt.stage < 3:
                steps.append((t.name, t.group or 0))
        elif t.kind is Kind.FROZEN:
            files.append(_file(t.name, "fp32", t.shape, t.segments))
    optim0 = ckpt.ranks[0].optim_file if ckpt.ranks else None
    if optim0 is None:
        raise DamagedCheckpointError(f"{ckpt.tag_dir}: the rank-0 optimizer file is missing.")
    copies = tuple((f.path, os.path.basename(f.path)) for f in ckpt.files if f.role == "model")
    return UniversalPlan(
        out_root=os.path.abspath(out_root),
        folder=folder or f"{ckpt.tag}_uni",
        stage=ckpt.stage,
        files=tuple(files),
        step_params=tuple(steps),
        copies=copies,
        optim_file=optim0,
        source=tuple((f.path, f.size, f.mtime_ns) for f in ckpt.files),
        sources=(ckpt.source,),
    )


def _file(name: str, state: str, shape: tuple[int, ...], segs: tuple[Segment, ...]) -> UniFile:
    dtype = segs[0].dtype if segs else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise UnsupportedCheckpointError(f"{name}: {state} is stored as {dtype}; expected a float dtype.")
    return UniFile(f"zero/{name}/{state}.pt", name, state, shape, dtype, segs)


# ---------------------------------------------------------------------------------------------- execute


@dataclass(frozen=True, slots=True)
class UniversalReport:
    out_dir: str
    files: int
    bytes_written: int
    reused: int


def prepare(plan: UniversalPlan, overwrite: bool) -> None:
    """Refuse to replace an existing universal folder or a different `latest_universal` without --overwrite."""
    latest = os.path.join(plan.out_root, LATEST)
    clash = []
    if os.path.exists(plan.out_dir):
        clash.append(plan.out_dir)
    if os.path.isfile(latest):
        with open(latest) as fh:
            if fh.read().strip() != plan.folder:
                clash.append(latest)
    if clash and not overwrite:
        raise OutputError(
            f"{' and '.join(clash)} already exist{'s' if len(clash) == 1 else ''}.",
            hint="Pass --overwrite to replace them, or choose another output folder.",
        )
    if os.path.exists(plan.out_dir) and not os.path.isdir(os.path.join(plan.out_dir, "zero")):
        raise OutputError(
            f"{plan.out_dir} exists and is not a universal checkpoint; not replacing it.",
            hint="Move it away or choose another output folder.",
        )


def write_universal(
    plan: UniversalPlan,
    *,
    overwrite: bool = False,
    workers: int | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int], None] | None = None,
) -> UniversalReport:
    """Carry out `plan`. `progress(bytes)` is called from worker threads as data is written."""
    from inspector.convert.output import FolderLock
    from inspector.format import ptwriter as pw  # the torch-zip writer (lazily: plan/preflight stay light)

    prepare(plan, overwrite)
    claim = FolderLock(plan.out_root)  # created and locked: a second run into OUT is refused, not mixed in
    ok = False
    try:
        prepare(plan, overwrite)  # again, now that no one else writes here
        report = _write_locked(plan, pw, workers, cancel, progress)
        ok = True
        return report
    finally:
        claim.release(ok)


def _write_locked(
    plan: UniversalPlan,
    pw: Any,
    workers: int | None,
    cancel: threading.Event | None,
    progress: Callable[[int], None] | None,
) -> UniversalReport:
    staging = plan.out_dir + PARTIAL
    _open_staging(plan, staging)
    cancel = cancel or threading.Event()
    lock = threading.Lock()
    written = [0]

    def report(n: int) -> None:
        with lock:
            written[0] += n
        if progress is not None:
            progress(n)

    finished = finished_files(staging)
    todo = [f for f in plan.files if not reusable(staging, f.rel, finished)]
    for f in plan.files:
        os.makedirs(inside(staging, os.path.dirname(f.rel)), exist_ok=True)
    journal = Journal(os.path.join(staging, JOURNAL))
    try:
        from inspector.convert.reader import FilePool
        from inspector.convert.writers.universal_state import write_small

        with FilePool(*plan.sources) as pool:
            write_small(plan, staging, pw)
            # files are independent; pread, crc32 and write release the GIL
            n = workers or default_workers()
            with ThreadPoolExecutor(max(1, n), thread_name_prefix="zi-uni") as ex:
                futures = [
                    ex.submit(_write_tensor, pw, pool, f, staging, cancel, report, journal) for f in todo
                ]
                try:
                    for fut in futures:
                        fut.result()
                except BaseException:
                    cancel.set()
                    raise
            for src, name in plan.copies:
                dst = inside(staging, name)
                if not reusable(staging, name, finished):
                    _copy_through(plan, src, dst + ".tmp")
                    os.replace(dst + ".tmp", dst)
                    journal.finished(name, dst)
                report(os.path.getsize(dst))
    except OSError as exc:
        raise OutputError(
            f"Writing {staging} failed: {exc.strerror or exc}.",
            hint="Check free disk space; rerun the same command to resume.",
        ) from None
    if cancel.is_set():
        raise CancelledError("Conversion cancelled; rerun the same command to resume.")
    if os.path.exists(plan.out_dir):  # only reached with --overwrite (prepare checked)
        shutil.rmtree(plan.out_dir)
    os.remove(os.path.join(staging, SOURCE_STAMP))
    os.remove(os.path.join(staging, JOURNAL))
    os.replace(staging, plan.out_dir)
    tmp = os.path.join(plan.out_root, LATEST + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(plan.folder)
    os.replace(tmp, os.path.join(plan.out_root, LATEST))
    return UniversalReport(plan.out_dir, len(plan.files), written[0], len(plan.files) - len(todo))


def _copy_through(plan: UniversalPlan, src: str, dest: str) -> None:
    """A model-states file, byte for byte, from a descriptor opened through the checkpoint's source."""
    fd = open_in(src, plan.sources)
    try:
        with os.fdopen(os.dup(fd), "rb") as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    finally:
        os.close(fd)


def default_workers() -> int:
    """Files written at once (each by one thread, with its own chunk buffers)."""
    return min(8, os.cpu_count() or 2)


def _open_staging(plan: UniversalPlan, staging: str) -> None:
    """Keep a staging folder left by the same job (same source files); otherwise start it afresh."""
    stamp = os.path.join(staging, SOURCE_STAMP)
    want = json.dumps([list(s) for s in plan.source])
    if os.path.isdir(staging):
        try:
            with open(stamp) as fh:
                same = fh.read() == want
        except OSError:
            same = False
        if not same:
            shutil.rmtree(staging)
    os.makedirs(staging, exist_ok=True)
    with open(stamp, "w") as fh:
        fh.write(want)
    for dirpath, _, names in os.walk(staging):  # a killed run leaves half-written *.tmp files
        for n in names:
            if n.endswith(".tmp"):
                os.remove(os.path.join(dirpath, n))


def _write_tensor(
    pw: Any,
    pool: Any,
    f: UniFile,
    staging: str,
    cancel: threading.Event,
    report: Callable[[int], None],
    journal: Journal,
) -> None:
    if cancel.is_set():
        return
    produce = _producer(pool, f, cancel, report)
    storage = pw.Storage("float32", _numel(f.shape), produce)
    tree = {"param": pw.Tensor(storage, f.shape), "cat_dim": 0}
    path = inside(staging, f.rel)
    pw.save(tree, path, chunk_elems=CHUNK_BYTES // 4)  # returns only once the file is complete and renamed
    journal.finished(f.rel, path)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _producer(
    pool: Any, f: UniFile, cancel: threading.Event, report: Callable[[int], None]
) -> Callable[[int, int], Any]:
    """Elements [start, start+count) of the tensor as fp32 bytes, read from its segments into one buffer."""
    src_size = itemsize(f.source_dtype)
    starts = []
    acc = 0
    for s in f.segments:
        starts.append(acc)
        acc += s.numel
    buf = np.empty(CHUNK_BYTES // 4, dtype=np.float32)
    raw = np.empty(CHUNK_BYTES // 4, dtype=np.uint16) if src_size == 2 else None

    def produce(start: int, count: int) -> Any:
        if cancel.is_set():
            raise CancelledError("Conversion cancelled.")
        out = buf[:count]
        target = out.view(np.uint8) if raw is None else raw[:count].view(np.uint8)
        i = bisect.bisect_right(starts, start) - 1
        pos, end = start, start + count
        while pos < end:
            seg = f.segments[i]
            local = pos - starts[i]
            take = min(end - pos, seg.numel - local)
            a = (pos - start) * src_size
            pool.read_into(seg.file, seg.offset + local * src_size, target.data[a : a + take * src_size])
            pos += take
            i += 1
        if raw is not None:
            _widen(raw[:count], f.source_dtype, out)
        report(count * 4)
        return out

    return produce


def _widen(src: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """16-bit to fp32 exactly (bf16 is the top half of an fp32; fp16 through numpy's exact upcast)."""
    if dtype == "bfloat16":
        np.left_shift(src.astype(np.uint32), 16, out=out.view(np.uint32))
    else:
        out[:] = src.view(np.float16)


def iter_rel_paths(plan: UniversalPlan) -> Iterator[str]:
    """Every file the plan writes, relative to the universal folder (for verify and tests)."""
    yield "zero/optimizer_state.pt"
    for f in plan.files:
        yield f.rel
    for name, _ in plan.step_params:
        yield f"zero/{name}/step.pt"
    for _, name in plan.copies:
        yield name
