"""Write a DeepSpeed universal checkpoint straight from a ZeRO checkpoint: plan as data, then stream.

Layout (FORMAT.md §4): `OUT/<tag>_uni/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt` as
`{'param': fp32 tensor in full shape, 'cat_dim': 0}`, a `step.pt` per parameter for stage 1/2, one
`zero/optimizer_state.pt` with the global optimizer state and hyperparameters, byte copies of the
model-states files, and `OUT/latest_universal` naming the folder. Every parameter is rebuilt from
`param_shapes` (so round-robin and aligned layouts come out right, unlike `ds_to_universal`) and streamed
chunk by chunk from the rank files into its `.pt` file: no temporary per-rank fragments, flat memory.

Output is atomic and resumable: OUT is an OutputRoot, locked for the run as for safetensors, and files
go to `OUT/<tag>_uni.partial/`, each written whole or not at all;
a rerun of the same job keeps the finished ones; the folder is renamed when complete, `latest_universal`
last. No torch here: `.pt` files come from `format.ptwriter`, fed with raw bytes.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.convert.output import part_indices
from inspector.convert.root import LOCK, Destination, OutputRoot
from inspector.convert.writers.universal_journal import JOURNAL, Journal
from inspector.errors import CancelledError, DamagedCheckpointError, OutputError, UnsupportedCheckpointError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Checkpoint, Kind, Segment
from inspector.system.bytesource import ByteSource, is_url, size_and_mtime, source_at
from inspector.system.limits import usable_cores
from inspector.system.source import open_in

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
    sources: tuple[ByteSource, ...] = ()  # the folders (or prefixes) the source files are read through

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

    def planned_sizes(self) -> dict[str, int]:
        """Every file's size as planned, by its path in the folder (the small files' sizes are estimates, the
        same ones `total_bytes` adds up)."""
        sizes = {f.rel: f.nbytes + FILE_OVERHEAD + 7 * len(f.state) for f in self.files}
        sizes |= {f"zero/{name}/step.pt": SMALL_FILE for name, _ in self.step_params}
        sizes |= {name: size_and_mtime(src)[0] for src, name in self.copies}
        sizes["zero/optimizer_state.pt"] = OPTIMIZER_STATE_ESTIMATE
        return sizes

    @property
    def total_bytes(self) -> int:
        copies = sum(size_and_mtime(src)[0] for src, _ in self.copies)
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
    if os.path.lexists(plan.out_dir):
        clash.append(plan.out_dir)
    if os.path.lexists(latest):
        try:
            same = os.path.isfile(latest) and _read_latest(latest) == plan.folder
        except OSError:
            same = False
        if not same:
            clash.append(latest)
    if clash and not overwrite:
        raise OutputError(
            f"{' and '.join(clash)} already exist{'s' if len(clash) == 1 else ''}.",
            hint="Pass --overwrite to replace them, or choose another output folder.",
        )
    if os.path.lexists(plan.out_dir) and (
        os.path.islink(plan.out_dir) or not os.path.isdir(os.path.join(plan.out_dir, "zero"))
    ):
        raise OutputError(
            f"{plan.out_dir} exists and is not a universal checkpoint; not replacing it.",
            hint="Move it away or choose another output folder.",
        )


def _read_latest(path: str) -> str:
    fd = open_in(path)
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def write_universal(
    plan: UniversalPlan,
    *,
    overwrite: bool = False,
    workers: int | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int], None] | None = None,
    part: tuple[int, int] | None = None,
    fsync: bool = False,
    dest: Destination | None = None,
) -> UniversalReport:
    """Carry out `plan`. `progress(bytes)` is called from worker threads as data is written. `fsync`: every
    file reaches the disk before it is journalled (so a later run trusts it without reading it back).

    `part` (i, n): write only part i of n of the tensor files (contiguous, balanced by bytes) into the shared
    staging folder, journalled under a journal of its own, and publish nothing; the run without `part`
    then writes the small files and anything missing, reuses every part's files by their checksums and
    publishes.

    `dest` (OUT is a bucket; `plan.out_root` is the staging folder): the files are written side by side as
    always, and published under `<tag>_uni/` one after the other in the writer's order (the small files, the
    tensor files in plan order, the model-states copies, `latest_universal` last), each leaving the staging
    folder as it goes up, so it holds about one file per writer thread. Files an earlier run of this job completed in the bucket are not
    written again. With `part` too, the part stages in a folder of its own and publishes its tensor files
    that way; the finishing run reuses every object the bucket holds of this job."""
    prepare(plan, overwrite)
    suffix = f".part-{part[0]}-of-{part[1]}" if part else ""
    root = OutputRoot(plan.out_root, lock_name=LOCK + suffix, dest=dest)  # a second run into OUT is refused, not mixed in
    ok = False
    try:
        root.refuse_running(part)
        prepare(plan, overwrite)  # again, now that no one else writes here
        report = _write_locked(plan, root, workers, cancel, progress, part, fsync)
        ok = True
        return report
    finally:
        root.release(ok)


def _write_locked(
    plan: UniversalPlan,
    root: OutputRoot,
    workers: int | None,
    cancel: threading.Event | None,
    progress: Callable[[int], None] | None,
    part: tuple[int, int] | None = None,
    fsync: bool = False,
) -> UniversalReport:
    # in a bucket every object is complete or absent: files go straight to <tag>_uni/, latest_universal last
    staging = plan.folder + ("" if root.dest is not None else PARTIAL)
    mine = [plan.files[k] for k in file_part(plan, part)] if part else list(plan.files)
    _open_staging(plan, root, staging, {f.rel for f in mine} if part else None)
    cancel = cancel or threading.Event()
    lock = threading.Lock()
    written = [0]

    def report(n: int) -> None:
        with lock:
            written[0] += n
        if progress is not None:
            progress(n)

    journal = Journal(root, staging, f".part-{part[0]}-of-{part[1]}" if part else "", synced=fsync)
    finished = journal.previous()
    todo = [f for f in mine if not journal.reusable(f.rel, finished) and not _published(root, staging, f.rel)]
    try:
        from inspector.convert.reader import FilePool
        from inspector.convert.writers.universal_state import write_small

        with FilePool(*plan.sources) as pool:
            if part is None:  # the finishing run writes the small files, once
                write_small(plan, root, staging, fsync)
            # files are independent; pread, crc32 and write release the GIL
            n = workers or default_workers()
            with ThreadPoolExecutor(max(1, n), thread_name_prefix="zi-uni") as ex:
                turns = _Turns() if root.dest is not None else None  # a bucket: published in plan order
                futures = [
                    ex.submit(_write_tensor, pool, f, root, staging, cancel, report, journal, fsync, (turns, k))
                    for k, f in enumerate(todo)
                ]
                try:
                    for fut in futures:
                        fut.result()
                except BaseException:
                    cancel.set()
                    raise
            for src, name in plan.copies if part is None else ():
                rel = f"{staging}/{name}"
                if not journal.reusable(name, finished) and not _published(root, staging, name):
                    root.copy_in(_source_of(plan, src), src, rel, fsync=fsync)
                    journal.finished(name)
                report(root.size(rel))
    except OSError as exc:
        raise OutputError(
            f"Writing {root.show(staging)} failed: {exc.strerror or exc}.",
            hint="Check free disk space; rerun the same command to resume.",
        ) from None
    if cancel.is_set():
        raise CancelledError("Conversion cancelled; rerun the same command to resume.")
    if part is not None:
        where = plan.out_dir if root.dest is not None else f"{plan.out_dir}{PARTIAL}"  # a bucket: up already
        return UniversalReport(where, len(mine), written[0], len(mine) - len(todo))
    if staging != plan.folder and root.lstat(plan.folder) is not None:  # only with --overwrite (prepare checked)
        root.remove_tree(plan.folder)
    root.remove(f"{staging}/{SOURCE_STAMP}")
    for name in root.listdir(staging):
        if name.startswith(JOURNAL):  # this run's journal and every part's
            root.remove(f"{staging}/{name}")
    if staging != plan.folder:
        root.replace(staging, plan.folder)
    root.write_atomic(LATEST, plan.folder.encode(), fsync=fsync)
    if fsync:  # the renames themselves
        root.fsync_dir()
    return UniversalReport(plan.out_dir, len(plan.files), written[0], len(plan.files) - len(todo))


def _published(root: OutputRoot, staging: str, rel: str) -> bool:
    """Whether the bucket already holds this job's complete `rel` (an object exists whole or not at all)."""
    return root.dest is not None and root.dest.holds(f"{staging}/{rel}", None)


def _source_of(plan: UniversalPlan, path: str) -> ByteSource:
    """The checkpoint folder a model-states file is read through (the input boundary opens it)."""
    for src in plan.sources:
        if src.contains(path):
            return src
    return source_at(os.path.dirname(path if is_url(path) else os.path.abspath(path)))


def default_workers() -> int:
    """Files written at once (each by one thread, with its own chunk buffers): the usable cores, up to 8."""
    return min(8, usable_cores())


def _open_staging(plan: UniversalPlan, root: OutputRoot, staging: str, mine: set[str] | None = None) -> None:
    """Keep a staging folder left by the same job (same source files); otherwise start it afresh. A part
    (`mine`: its files) shares the folder with the other parts: it never wipes it (another job's staging is
    refused instead) and removes only its own half-written files."""
    stamp = f"{staging}/{SOURCE_STAMP}"
    want = json.dumps([list(s) for s in plan.source]).encode()
    if root.lstat(staging) is not None and root.read_small(stamp) != want:
        if mine is not None:
            raise OutputError(
                f"{root.show(staging)} holds an unfinished export of another job.",
                hint="Finish or remove it (a run without --part replaces it), then start the parts again.",
                title="Output folder in use",
            )
        root.remove_tree(staging)
    root.mkdirs(staging)
    root.write_atomic(stamp, want)
    for rel in list(root.walk_files(staging)):  # a killed run leaves half-written *.tmp files
        own = mine is None or rel[len(staging) + 1 : -len(".tmp")] in mine
        if rel.endswith(".tmp") and own:
            root.remove(rel)


def file_part(plan: UniversalPlan, part: tuple[int, int]) -> list[int]:
    """The tensor files part `i` of `n` writes (the small files are the finishing run's)."""
    return part_indices([f.nbytes for f in plan.files], part)


def _write_tensor(
    pool: Any,
    f: UniFile,
    root: OutputRoot,
    staging: str,
    cancel: threading.Event,
    report: Callable[[int], None],
    journal: Journal,
    fsync: bool = False,
    turn: tuple[_Turns | None, int] = (None, 0),
) -> None:
    if cancel.is_set():
        return
    from inspector.format import ptwriter as pw  # the torch-zip writer (lazily: plan/preflight stay light)

    produce = _producer(pool, f, cancel, report)
    storage = pw.Storage("float32", _numel(f.shape), produce)
    tree = {"param": pw.Tensor(storage, f.shape), "cat_dim": 0}
    archive = f.state  # torch names the archive folder after the file
    rel = f"{staging}/{f.rel}"
    turns, k = turn
    done = rel if turns is None else rel + PARTIAL  # a partial name stays in the staging folder
    root.write_with(done, lambda fh: pw.dump(tree, fh, archive, chunk_elems=CHUNK_BYTES // 4), fsync=fsync)
    if turns is not None:  # written side by side, published strictly one after the other
        turns.wait(k, cancel)
        try:
            root.replace(done, rel)
        finally:
            turns.done(k)
    journal.finished(f.rel)


class _Turns:
    """Files written by several threads, published (uploaded) one after the other in plan order: the k-th
    waits for the (k-1)-th. Tasks start in order, so a wait never outlives its predecessors; cancel ends it."""

    def __init__(self) -> None:
        self.next = 0
        self.cond = threading.Condition()

    def wait(self, k: int, cancel: threading.Event) -> None:
        with self.cond:
            while self.next != k:
                if cancel.is_set():
                    raise CancelledError("Conversion cancelled.")
                self.cond.wait(0.1)

    def done(self, k: int) -> None:
        with self.cond:
            self.next = k + 1
            self.cond.notify_all()


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
