#!/usr/bin/env python
"""Benchmark `zero-inspector convert` against the I/O floor and DeepSpeed's own zero_to_torch.

For every case of the matrix (ZeRO stage x model size) this script

1. writes a demo checkpoint with ``python -m inspector demo`` (bf16 training, 2 ranks, no tied weights:
   DeepSpeed's tool cannot write tied weights as safetensors),
2. asks ``python -m inspector preflight --json`` what the conversion will cost,
3. runs, each in a fresh process and after the same cache preparation:
   the I/O floor (exactly the byte ranges our plan reads, ``preadv`` into one reused 16 MiB buffer, and
   ``pwrite`` of the same output layout), our converter, ``inspector verify`` on our output and DeepSpeed's
   ``zero_to_torch --safe_serialization``; for each it records the wall time, the peak RSS of the whole process
   tree (sampled every 20 ms) and the child's own ru_maxrss (from wait4),
4. compares a few tensors of our output with DeepSpeed's (bit for bit),

then prints markdown tables with PASS/FAIL against the project's targets and writes them to
``tests/benchmarks/results.md``.  Run it with ``tox -e bench`` or directly:

    python tests/benchmarks/bench_convert.py --quick            # 50M and 100M parameters, a few minutes
    python tests/benchmarks/bench_convert.py                    # 500M and 1G parameters, ZeRO-2 and ZeRO-3
    python tests/benchmarks/bench_convert.py --cold             # drop the page cache before every timed run

Each checkpoint takes ~14 bytes per parameter on disk and is deleted after its case unless ``--keep``
(kept checkpoints in ``--workdir`` are reused by later runs).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if importlib.util.find_spec("inspector") is None:  # running from a checkout without an install
    sys.path.insert(0, str(REPO))

from inspector.system.rss import MemorySampler  # noqa: E402
from inspector.system.units import format_bytes, parse_size  # noqa: E402

MiB = 1024 * 1024
BUFFER_BYTES = 16 * MiB
BYTES_PER_PARAM_ON_DISK = 14  # fp32 master + two Adam moments + the 16-bit model copy
OUT_DTYPE = "bf16"
SHARD_SIZE = "1GB"
DEFAULT_SIZES = ("500M", "1G")
QUICK_SIZES = ("50M", "100M")
DEFAULT_STAGES = (2, 3)
SAMPLE_INTERVAL = 0.02
COMPARE_TENSORS = 6
MARKER = ".bench-complete"
DROP_CACHES = "/proc/sys/vm/drop_caches"

# targets (see the project brief); a result outside them is reported as FAIL, never adjusted
TARGET_PEAK = 128 * MiB  # issue 9: convert and verify, whole process, no torch
TARGET_FLAT = 64 * MiB
TARGET_VS_DS = 0.35  # issue 9: 0.5B, warm cache, bf16 out, whole process
TARGET_VS_FLOOR = 2.0
TARGET_PREFLIGHT = 0.25
TARGET_BYTES = 0.01
TARGET_DS_PRED = 0.30
CONTENTION_CORES = 0.25  # average cores used by other processes during a run before we warn


class BenchError(Exception):
    """A step could not run; the message says which and why."""


# ----------------------------------------------------------------------------------------------------------
# child-process modes: the I/O floor and the tensor comparison run in fresh interpreters
# ----------------------------------------------------------------------------------------------------------


def _drop_caches() -> None:
    os.sync()
    with open(DROP_CACHES, "w") as fh:
        fh.write("1")


def floor_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Read exactly the plan's source ranges and write exactly its output layout, timing each part."""
    from inspector.convert.options import ConvertOptions
    from inspector.convert.plan import INDEX_NAME, build_plan
    from inspector.scan.scanner import scan

    t0 = time.perf_counter()
    plan = build_plan(scan(spec["root"]), ConvertOptions(dtype=spec["dtype"], shard_size=spec["shard_size"]))
    plan_s = time.perf_counter() - t0
    out_dir: str = spec["out"]
    cold: bool = spec["cold"]
    os.makedirs(out_dir, exist_ok=True)
    buf = bytearray(os.urandom(1 << 16) * (BUFFER_BYTES >> 16))  # not zeros: no filesystem shortcut
    view = memoryview(buf)
    fds: dict[str, int] = {}

    def src_fd(path: str) -> int:
        if path not in fds:
            fds[path] = os.open(path, os.O_RDONLY)
        return fds[path]

    def read_range(path: str, offset: int, nbytes: int) -> Iterator[int]:
        fd = src_fd(path)
        while nbytes > 0:
            got = os.preadv(fd, [view[: min(nbytes, BUFFER_BYTES)]], offset)
            if got <= 0:
                raise EOFError(f"{path}: short read at {offset}")
            offset += got
            nbytes -= got
            yield got

    def pwrite_all(fd: int, offset: int, nbytes: int) -> None:
        while nbytes > 0:
            n = os.pwrite(fd, view[: min(nbytes, BUFFER_BYTES)], offset)
            offset += n
            nbytes -= n

    def clear_outputs() -> None:
        for name in os.listdir(out_dir):
            os.unlink(os.path.join(out_dir, name))

    def open_out(name: str) -> int:
        return os.open(os.path.join(out_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write_index() -> list[int]:
        if plan.index is None:
            return []
        fd = open_out(INDEX_NAME)
        os.pwrite(fd, plan.index, 0)
        return [fd]

    def finish(out_fds: list[int]) -> float:
        """fsync (timed separately) and close."""
        start = time.perf_counter()
        for fd in out_fds:
            os.fsync(fd)
        fsync_s = time.perf_counter() - start
        for fd in out_fds:
            os.close(fd)
        return fsync_s

    # 1. reads only, in plan order
    if cold:
        _drop_caches()
    start = time.perf_counter()
    read_bytes = 0
    for shard in plan.shards:
        for t in shard.tensors:
            for seg in t.segments:
                read_bytes += sum(read_range(seg.file, seg.offset, seg.nbytes))
    read_s = time.perf_counter() - start

    # 2. writes only, same files and sizes
    if cold:
        _drop_caches()
    start = time.perf_counter()
    out_fds: list[int] = []
    written = 0
    for shard in plan.shards:
        fd = open_out(shard.filename)
        out_fds.append(fd)
        os.pwrite(fd, shard.header, 0)
        pwrite_all(fd, len(shard.header), shard.data_bytes)
        written += shard.file_bytes
    out_fds += write_index()
    written += len(plan.index or b"")
    write_s = time.perf_counter() - start
    write_fsync_s = finish(out_fds)
    clear_outputs()

    # 3. one pass that reads each tensor's sources and writes its output bytes as it goes
    if cold:
        _drop_caches()
    start = time.perf_counter()
    out_fds = []
    for shard in plan.shards:
        fd = open_out(shard.filename)
        out_fds.append(fd)
        os.pwrite(fd, shard.header, 0)
        base = len(shard.header)
        for t in shard.tensors:
            src_total = sum(seg.nbytes for seg in t.segments)
            done = out_done = 0
            for seg in t.segments:
                for got in read_range(seg.file, seg.offset, seg.nbytes):
                    done += got
                    target = done * t.nbytes // src_total  # output bytes owed for the source read so far
                    pwrite_all(fd, base + t.offset + out_done, target - out_done)
                    out_done = target
    out_fds += write_index()
    together_s = time.perf_counter() - start
    together_fsync_s = finish(out_fds)
    clear_outputs()
    for fd in fds.values():
        os.close(fd)
    return {
        "plan_s": plan_s,
        "read_s": read_s,
        "write_s": write_s,
        "write_fsync_s": write_fsync_s,
        "together_s": together_s,
        "together_fsync_s": together_fsync_s,
        "read_bytes": read_bytes,
        "plan_read_bytes": plan.read_bytes,
        "written_bytes": written,
        "output_bytes": plan.output_bytes,
        "numel": sum(t.numel for s in plan.shards for t in s.tensors),
        "shards": len(plan.shards),
    }


def _st_files(out_dir: str) -> dict[str, str]:
    """tensor name -> safetensors file, from the index or the single file's header."""
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            return {k: os.path.join(out_dir, v) for k, v in json.load(fh)["weight_map"].items()}
    single = os.path.join(out_dir, "model.safetensors")
    with open(single, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    return {k: single for k in header if k != "__metadata__"}


def compare_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Compare names of both outputs and a few tensors bit for bit (first, last, largest, evenly spaced)."""
    import torch
    from safetensors import safe_open

    ours, theirs = _st_files(spec["ours"]), _st_files(spec["theirs"])
    only_ours = sorted(set(ours) - set(theirs))
    only_theirs = sorted(set(theirs) - set(ours))
    common = [k for k in ours if k in theirs]
    picked: list[str] = []
    if common:
        sizes: dict[str, int] = {}
        for path in set(ours.values()):
            with safe_open(path, framework="pt") as f:
                for k in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    shape = f.get_slice(k).get_shape()
                    n = 1
                    for d in shape:
                        n *= d
                    sizes[k] = n
        step = max(1, len(common) // max(1, spec["count"] - 3))
        candidates = [common[0], common[-1], max(common, key=lambda k: sizes.get(k, 0)), *common[::step]]
        for k in candidates:
            if k not in picked:
                picked.append(k)
            if len(picked) >= spec["count"]:
                break
    mismatched: list[str] = []
    checked_bytes = 0
    for k in picked:
        with safe_open(ours[k], framework="pt") as fa, safe_open(theirs[k], framework="pt") as fb:
            a, b = fa.get_tensor(k), fb.get_tensor(k)
        same = a.dtype == b.dtype and a.shape == b.shape
        if same:
            same = torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        if not same:
            mismatched.append(f"{k} ({a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)})")
        checked_bytes += a.numel() * a.element_size()
    return {
        "checked": picked,
        "checked_bytes": checked_bytes,
        "mismatched": mismatched,
        "only_ours": only_ours[:10],
        "only_theirs": only_theirs[:10],
        "n_only_ours": len(only_ours),
        "n_only_theirs": len(only_theirs),
        "n_common": len(common),
    }


# ----------------------------------------------------------------------------------------------------------
# measuring a child process
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured child process."""

    label: str
    argv: list[str]
    rc: int
    wall: float
    peak_tree: int
    ru_maxrss: int
    samples: int
    stdout: str
    stderr: str
    other_cpu: float = 0.0  # CPU seconds the rest of the machine used meanwhile (contention)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def other_load(self) -> float:
        """Average number of cores busy with other processes while this one ran."""
        return self.other_cpu / self.wall if self.wall > 0 else 0.0

    def failure(self) -> str:
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-12:]
        return f"{self.label} exited with {self.rc}:\n    " + "\n    ".join(tail)

    def last_json(self) -> dict[str, Any]:
        """The JSON object a child printed (the last line that parses, or the whole stdout)."""
        with contextlib.suppress(json.JSONDecodeError):
            return dict(json.loads(self.stdout))
        for line in reversed(self.stdout.strip().splitlines()):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(line)
                if isinstance(value, dict):
                    return value
        raise BenchError(f"{self.label} printed no JSON; stdout was:\n{self.stdout[-2000:]}")


class Runner:
    """Starts children in their own session, samples their tree, reaps them with wait4."""

    def __init__(self, logs: Path, env: dict[str, str], timeout: float) -> None:
        self.logs = logs
        self.env = env
        self.timeout = timeout
        self.count = 0

    def run(self, label: str, argv: Sequence[str], timeout: float | None = None) -> Run:
        self.count += 1
        stem = self.logs / f"{self.count:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}"
        out_path, err_path = stem.with_suffix(".out"), stem.with_suffix(".err")
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
            busy_before = _busy_cpu_seconds()
            start = time.perf_counter()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out_f,
                stderr=err_f,
                env=self.env,
                start_new_session=True,  # its own process group, so a timeout can end the whole tree
            )
            sampler = MemorySampler(pid=proc.pid, interval=SAMPLE_INTERVAL).start()
            timed_out = threading.Event()

            def kill() -> None:
                timed_out.set()
                _kill_group(proc.pid)

            timer = threading.Timer(timeout or self.timeout, kill)
            timer.daemon = True
            timer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:
                _kill_group(proc.pid)
                with contextlib.suppress(ChildProcessError):
                    os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise
            finally:
                timer.cancel()
            wall = time.perf_counter() - start
            busy = _busy_cpu_seconds() - busy_before
            proc.returncode = os.waitstatus_to_exitcode(status)
            # grandchildren (if any) share the session; make sure none outlives the measurement
            _kill_group(proc.pid)
            peak = sampler.stop()
        stdout = out_path.read_text(errors="replace")
        stderr = err_path.read_text(errors="replace")
        if timed_out.is_set():
            stderr += f"\n[bench] killed after {timeout or self.timeout:.0f} s timeout"
        maxrss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        other = max(0.0, busy - usage.ru_utime - usage.ru_stime)
        return Run(
            label, list(argv), proc.returncode, wall, peak, maxrss, sampler.samples, stdout, stderr, other
        )


def _busy_cpu_seconds() -> float:
    """Machine-wide non-idle CPU time (guest time is already inside user)."""
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------
# one case
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    stage: int
    size: str
    params: int | None = None
    demo: Run | None = None
    demo_reused: bool = False
    ckpt_bytes: int = 0
    preflight: dict[str, Any] | None = None
    preflight_run: Run | None = None
    floor: dict[str, Any] | None = None
    floor_run: Run | None = None
    ours: Run | None = None
    ours_bytes: int | None = None
    ours_internal_s: float | None = None
    verify: Run | None = None
    ours_module: Run | None = None  # `convert --source module` (stage 1/2): the 16-bit copy, no cast
    ds: Run | None = None
    ds_bytes: int | None = None
    compare: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"ZeRO-{self.stage} {self.size}"

    @property
    def slug(self) -> str:
        return f"s{self.stage}-{self.size}"

    def floor_s(self, fsync: bool) -> float | None:
        if self.floor is None:
            return None
        return float(self.floor["together_s"] + (self.floor["together_fsync_s"] if fsync else 0.0))


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _output_bytes(path: Path) -> int:
    """Bytes of the safetensors output (shards + index), what preflight's output_bytes predicts."""
    return sum(
        p.stat().st_size
        for p in path.iterdir()
        if p.is_file() and (p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json")
    )


def _warm(root: Path) -> tuple[int, float]:
    """Read every file of the checkpoint once so all tools start with the same (hot) page cache."""
    start = time.perf_counter()
    buf = bytearray(BUFFER_BYTES)
    view = memoryview(buf)
    total = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                total += n
    return total, time.perf_counter() - start


@dataclass
class Settings:
    sizes: list[str]
    stages: list[int]
    workdir: Path
    own_workdir: bool
    keep: bool
    cold: bool
    fsync: bool
    fsync_flag: bool  # convert has a --fsync option
    deepspeed: bool
    results: Path
    timeout: float
    python: str = sys.executable


class Bench:
    def __init__(self, s: Settings, runner: Runner) -> None:
        self.s = s
        self.runner = runner

    def py(self, *args: str) -> list[str]:
        return [self.s.python, *args]

    def prepare_cache(self, root: Path, note: list[str]) -> None:
        os.sync()  # no writeback of an earlier step may overlap the next timed run
        if self.s.cold:
            _drop_caches()
        else:
            n, secs = _warm(root)
            note.append(f"warmed {format_bytes(n)} in {secs:.1f} s")

    def checkpoint(self, case: Case) -> Path:
        root = self.s.workdir / f"ckpt-{case.slug}"
        marker = root / MARKER
        if marker.exists():
            info = json.loads(marker.read_text())
            case.params = info.get("params")
            case.demo_reused = True
            case.ckpt_bytes = _dir_bytes(root)
            return root
        if root.exists():
            shutil.rmtree(root)
        need = int(parse_size(case.size) * (BYTES_PER_PARAM_ON_DISK + 4) * 1.05)  # + two bf16 outputs
        free = shutil.disk_usage(self.s.workdir).free
        if free < need:
            raise BenchError(
                f"{case.label}: needs about {format_bytes(need)} of disk in {self.s.workdir} "
                f"(checkpoint + 2 outputs) but only {format_bytes(free)} is free. Use --workdir on a bigger "
                "disk, smaller --sizes, or drop --keep."
            )
        argv = self.py(
            "-m", "inspector", "demo", str(root), "--stage", str(case.stage), "--params", case.size,
            "--world-size", "2", "--dtype", "bf16", "--no-tied",
        )  # fmt: skip
        case.demo = self.runner.run(f"demo-{case.slug}", argv, timeout=max(self.s.timeout, 3600))
        if not case.demo.ok:
            raise BenchError(case.demo.failure())
        m = re.search(r"\(([\d,]+)\s+parameters\)", case.demo.stdout)
        case.params = int(m.group(1).replace(",", "")) if m else None
        case.ckpt_bytes = _dir_bytes(root)
        marker.write_text(json.dumps({"params": case.params, "size": case.size, "stage": case.stage}))
        return root

    def run_case(self, case: Case) -> None:
        s = self.s
        root = self.checkpoint(case)
        out = s.workdir / f"out-{case.slug}"
        out_ds = s.workdir / f"out-ds-{case.slug}"
        out_floor = s.workdir / f"out-floor-{case.slug}"
        for d in (out, out_ds, out_floor):
            if d.exists():
                shutil.rmtree(d)
        try:
            notes: list[str] = []
            # preflight (not timed against a target; its process is what `convert` will look like)
            pre = self.runner.run(
                f"preflight-{case.slug}",
                self.py(
                    "-m", "inspector", "preflight", str(root), "--dtype", OUT_DTYPE, "--shard-size",
                    SHARD_SIZE, "--out", str(out), "--json",
                ),
            )  # fmt: skip
            case.preflight_run = pre
            if pre.rc not in (0, 3):  # 3 = "does not fit": still a prediction
                case.errors.append(pre.failure())
            else:
                case.preflight = pre.last_json()

            # a. I/O floor
            self.prepare_cache(root, notes)
            spec = {
                "root": str(root),
                "out": str(out_floor),
                "dtype": OUT_DTYPE,
                "shard_size": parse_size(SHARD_SIZE),
                "cold": s.cold,
            }
            case.floor_run = self.runner.run(
                f"floor-{case.slug}", self.py(str(Path(__file__).resolve()), "--_floor", json.dumps(spec))
            )
            if case.floor_run.ok:
                case.floor = case.floor_run.last_json()
                if case.params is None:
                    case.params = int(case.floor["numel"])
            else:
                case.errors.append(case.floor_run.failure())
            shutil.rmtree(out_floor, ignore_errors=True)

            # b. ours
            self.prepare_cache(root, notes)
            argv = self.py(
                "-m", "inspector", "convert", str(root), str(out), "--dtype", OUT_DTYPE, "--shard-size", SHARD_SIZE,
            )  # fmt: skip
            if s.fsync and s.fsync_flag:
                argv.append("--fsync")
            case.ours = self.runner.run(f"ours-{case.slug}", argv)
            if case.ours.ok:
                case.ours_bytes = _output_bytes(out)
                m = re.search(r"Done\s+in\s+([\d.]+)\s*s", case.ours.stdout)
                case.ours_internal_s = float(m.group(1)) if m else None
                # verify (page cache as left by the conversion: it re-reads the sources and our output)
                case.verify = self.runner.run(
                    f"verify-{case.slug}", self.py("-m", "inspector", "verify", str(root), str(out))
                )
                if not case.verify.ok:
                    case.errors.append(case.verify.failure())
            else:
                case.errors.append(case.ours.failure())

            # b2. ours, reading the 16-bit module copy (half the bytes, no cast; stage 1/2 only)
            if case.stage < 3:
                out_mod = s.workdir / f"out-module-{case.slug}"
                shutil.rmtree(out_mod, ignore_errors=True)
                self.prepare_cache(root, notes)
                case.ours_module = self.runner.run(
                    f"ours-module-{case.slug}",
                    self.py(
                        "-m", "inspector", "convert", str(root), str(out_mod), "--dtype", OUT_DTYPE,
                        "--shard-size", SHARD_SIZE, "--source", "module",
                    ),
                )  # fmt: skip
                if not case.ours_module.ok:
                    case.errors.append(case.ours_module.failure())
                shutil.rmtree(out_mod, ignore_errors=True)

            # c. DeepSpeed
            if s.deepspeed:
                shutil.rmtree(out_ds, ignore_errors=True)
                self.prepare_cache(root, notes)
                case.ds = self.runner.run(
                    f"deepspeed-{case.slug}",
                    self.py(
                        "-m", "deepspeed.utils.zero_to_torch", str(root), str(out_ds), "--dtype", OUT_DTYPE,
                        "--max_shard_size", SHARD_SIZE, "--safe_serialization",
                    ),
                )  # fmt: skip
                if case.ds.ok:
                    case.ds_bytes = _output_bytes(out_ds)
                    if case.ours is not None and case.ours.ok:
                        spec = {"ours": str(out), "theirs": str(out_ds), "count": COMPARE_TENSORS}
                        cmp_run = self.runner.run(
                            f"compare-{case.slug}",
                            self.py(str(Path(__file__).resolve()), "--_compare", json.dumps(spec)),
                        )
                        if cmp_run.ok:
                            case.compare = cmp_run.last_json()
                        else:
                            case.errors.append(cmp_run.failure())
                else:
                    case.errors.append(case.ds.failure())
            if notes and not s.cold:
                case_notes = f"{case.label}: page cache warmed before each timed run ({'; '.join(notes)})"
                NOTES.append(case_notes)
        finally:
            for d in (out, out_ds, out_floor):
                shutil.rmtree(d, ignore_errors=True)
            if not s.keep:
                shutil.rmtree(root, ignore_errors=True)


NOTES: list[str] = []


# ----------------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "–" if n is None else f"{n / MiB:,.0f} MiB"


def _err(pred: float | None, measured: float | None) -> float | None:
    if pred is None or not measured:
        return None
    return (pred - measured) / measured


def _pct(e: float | None) -> str:
    return "–" if e is None else f"{e * 100:+.0f}%"


def _secs(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}×"


def _gb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e9:.3f} GB"


def machine_info(workdir: Path) -> list[str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        import psutil

        ram = format_bytes(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover - psutil is a dependency
        ram = "unknown"
    usage = shutil.disk_usage(workdir)
    df = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        lines = subprocess.run(
            ["df", "-hT", str(workdir)], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
        if len(lines) >= 2:
            f = lines[-1].split()
            df = f" ({f[0]}, {f[1]}, mounted on {f[-1]})"

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    code = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(REPO)]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode == 0:
            dirty = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no", "inspector"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            code = f" at commit {head.stdout.strip()}" + (
                " + uncommitted changes in inspector/" if dirty else ""
            )
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"- Date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- CPU: {cpu}; {os.cpu_count()} logical cores ({affinity} usable)",
        f"- RAM: {ram}",
        "- Load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"- Disk (workdir {workdir}): {format_bytes(usage.total)} total, {format_bytes(usage.free)} free{df}",
        f"- OS: {platform.platform()}",
        f"- Python {platform.python_version()}, torch {version('torch')}, deepspeed {version('deepspeed')}, "
        f"safetensors {version('safetensors')}, zero-inspector {version('zero-inspector')}{code}",
    ]


def _check(ok: bool | None) -> str:
    return "SKIP" if ok is None else ("PASS" if ok else "FAIL")


def _result_row(
    case: str, params: str, tool: str, r: Run, wall: float | None, out: int | None, *cells: str
) -> str:
    """One results row; ``cells`` fill the x-floor, x-DS, predicted peak, time and bytes columns."""
    tput = f"{out / wall / 1e6:,.0f}" if out and wall else "–"
    extra = list(cells) + [""] * (5 - len(cells))
    status = "" if r.ok else f" (FAILED, exit {r.rc})"
    row = [case, params, tool + status, _secs(wall if r.ok else r.wall), _mib(r.peak_tree), _mib(r.ru_maxrss)]
    row += [_gb(out), tput, *extra[:5], f"{r.other_load:.2f} cores"]
    return "| " + " | ".join(row) + " |"


def render(cases: list[Case], s: Settings, header: list[str], finished: bool) -> str:
    fsync_floor = s.fsync
    lines = ["# zero-inspector conversion benchmark", "", *header, ""]
    lines.append(
        f"- Matrix: stages {', '.join(map(str, s.stages))} × sizes {', '.join(s.sizes)}; bf16 training, "
        f"2 ranks, no tied weights; output {OUT_DTYPE}, {SHARD_SIZE} shards"
    )
    cache = (
        "cold: `sync; echo 1 > /proc/sys/vm/drop_caches` before every timed run (and before each floor phase)"
        if s.cold
        else "warm: every checkpoint file is read once (and `sync` run) before every timed run"
    )
    lines.append(f"- Page cache: {cache}")
    lines.append(
        "- Our converter "
        + ("fsyncs its output" if s.fsync else "does not fsync")
        + (" (--fsync passed)" if s.fsync and s.fsync_flag else "")
        + "; the I/O floor used for the ratio "
        + ("includes" if fsync_floor else "excludes")
        + " fsync; DeepSpeed never fsyncs"
    )
    lines.append(
        "- Wall = whole process (interpreter start, imports, scan, conversion); peak RSS = sum over the process "
        f"tree, sampled every {SAMPLE_INTERVAL * 1000:.0f} ms; ru_maxrss = the child's own peak from wait4"
    )
    if not finished:
        lines.append(
            f"- **Partial results: {sum(1 for c in cases if c.ours or c.errors)} of {len(cases)} cases**"
        )
    lines += [
        "",
        "## Results",
        "",
        "| case | params | tool | wall s | peak RSS (tree) | ru_maxrss | output | MB/s | × floor | × DS wall "
        "| predicted peak (err) | predicted time (err) | predicted bytes (err) | other load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        params = f"{c.params:,}" if c.params else c.size
        floor_s = c.floor_s(fsync_floor)
        ds_wall = c.ds.wall if c.ds and c.ds.ok else None
        pre = c.preflight or {}

        def add(tool: str, r: Run, wall: float | None, out: int | None, *cells: str) -> None:
            lines.append(_result_row(c.label, params, tool, r, wall, out, *cells))  # noqa: B023

        if c.preflight_run is not None:
            add("preflight (scan + plan + predict)", c.preflight_run, c.preflight_run.wall, None, "", "")
        if c.floor_run is not None:
            fb = c.floor["written_bytes"] if c.floor else None
            add("I/O floor (I/O time only)", c.floor_run, floor_s, fb, "1.00×", _ratio(floor_s, ds_wall))
        if c.ours is not None:
            r = c.ours
            wall = r.wall if r.ok else None
            p_peak = pre.get("predicted_peak_rss_bytes")
            p_time = pre.get("estimated_seconds")
            p_bytes = pre.get("output_bytes")
            add(
                "**zero-inspector convert**",
                r,
                wall,
                c.ours_bytes,
                _ratio(wall, floor_s),
                _ratio(wall, ds_wall),
                f"{_mib(p_peak)} ({_pct(_err(p_peak, r.peak_tree))})",
                f"{_secs(p_time)} ({_pct(_err(p_time, wall))})",
                f"{_gb(p_bytes)} ({_pct(_err(p_bytes, c.ours_bytes))})",
            )
        if c.verify is not None:
            add("zero-inspector verify", c.verify, c.verify.wall, None)
        if c.ours_module is not None:
            r = c.ours_module
            wall = r.wall if r.ok else None
            add("zero-inspector convert --source module", r, wall, c.ours_bytes if r.ok else None,
                _ratio(wall, floor_s), _ratio(wall, ds_wall))  # fmt: skip
        if c.ds is not None:
            r = c.ds
            wall = r.wall if r.ok else None
            p_ds = pre.get("deepspeed_zero_to_fp32_peak_rss_bytes")
            add(
                "DeepSpeed zero_to_torch",
                r,
                wall,
                c.ds_bytes,
                _ratio(wall, floor_s),
                _ratio(wall, ds_wall),
                f"{_mib(p_ds)} ({_pct(_err(p_ds, r.peak_tree if r.ok else None))})",
            )

    # floor details
    lines += [
        "",
        "## I/O floor breakdown",
        "",
        "Same byte ranges as our plan, `preadv` into one reused 16 MiB buffer; `pwrite` of the same shard "
        "layout. *Together* = one single-threaded pass reading each tensor and writing its output as it goes.",
        "",
        "| case | read | read s | read GB/s | write | write s | fsync s | together s | together + fsync s "
        "| floor process wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        f = c.floor
        if not f or c.floor_run is None:
            continue
        lines.append(
            f"| {c.label} | {_gb(f['read_bytes'])} | {f['read_s']:.2f} | "
            f"{f['read_bytes'] / max(f['read_s'], 1e-9) / 1e9:.2f} | {_gb(f['written_bytes'])} | "
            f"{f['write_s']:.2f} | {f['write_fsync_s']:.2f} | {f['together_s']:.2f} | "
            f"{f['together_s'] + f['together_fsync_s']:.2f} | {c.floor_run.wall:.2f} |"
        )

    # checks
    lines += ["", "## Targets", "", "| case | check | measured | target | result |", "|---|---|---:|---|---|"]
    results: list[str] = []

    def row(case: str, check: str, measured: str, target: str, ok: bool | None) -> None:
        results.append(_check(ok))
        lines.append(f"| {case} | {check} | {measured} | {target} | **{_check(ok)}** |")

    for c in cases:
        ok_run = c.ours if c.ours is not None and c.ours.ok else None
        pre = c.preflight or {}
        ds = c.ds if c.ds is not None and c.ds.ok else None
        floor_s = c.floor_s(fsync_floor)
        if c.ours is not None and not c.ours.ok:
            row(c.label, "conversion ran", f"exit {c.ours.rc}", "exit 0", False)
        row(c.label, "peak RSS (tree)", _mib(ok_run.peak_tree) if ok_run else "–", "≤ 128 MiB",
            ok_run.peak_tree <= TARGET_PEAK if ok_run else None)  # fmt: skip
        ver = c.verify if c.verify is not None and c.verify.ok else None
        row(c.label, "verify peak RSS (tree)", _mib(ver.peak_tree) if ver else "–", "≤ 128 MiB",
            ver.peak_tree <= TARGET_PEAK if ver else None)  # fmt: skip
        row(c.label, "wall vs DeepSpeed", _ratio(ok_run.wall, ds.wall) if ok_run and ds else "–", "≤ 0.35×",
            ok_run.wall <= TARGET_VS_DS * ds.wall if ok_run and ds else None)  # fmt: skip
        mod = c.ours_module if c.ours_module is not None and c.ours_module.ok else None
        if mod is not None:
            row(c.label, "--source module: peak RSS / wall vs DeepSpeed",
                f"{_mib(mod.peak_tree)} / {_ratio(mod.wall, ds.wall) if ds else '–'}", "≤ 128 MiB / ≤ 0.35×",
                mod.peak_tree <= TARGET_PEAK and (ds is None or mod.wall <= TARGET_VS_DS * ds.wall))  # fmt: skip
        row(c.label, "wall vs I/O floor", _ratio(ok_run.wall, floor_s) if ok_run and floor_s else "–",
            "≤ 2× (whole process)", ok_run.wall <= TARGET_VS_FLOOR * floor_s if ok_run and floor_s else None)  # fmt: skip
        inner = c.ours_internal_s if ok_run else None
        row(c.label, "conversion phase vs I/O floor", _ratio(inner, floor_s) if inner and floor_s else "–",
            "≤ 2× (our 'Done in' time: no start-up, scan or preflight)",
            inner <= TARGET_VS_FLOOR * floor_s if inner and floor_s else None)  # fmt: skip
        e = _err(pre.get("predicted_peak_rss_bytes"), ok_run.peak_tree if ok_run else None)
        row(
            c.label,
            "preflight peak RSS",
            _pct(e),
            "±25%",
            abs(e) <= TARGET_PREFLIGHT if e is not None else None,
        )
        e = _err(pre.get("estimated_seconds"), ok_run.wall if ok_run else None)
        row(c.label, "preflight time", _pct(e), "±25%", abs(e) <= TARGET_PREFLIGHT if e is not None else None)
        e = _err(pre.get("output_bytes"), c.ours_bytes if ok_run else None)
        row(c.label, "preflight output bytes", _pct(e) if e is None else f"{e * 100:+.3f}%", "±1%",
            abs(e) <= TARGET_BYTES if e is not None else None)  # fmt: skip
        e = _err(pre.get("deepspeed_zero_to_fp32_peak_rss_bytes"), ds.peak_tree if ds else None)
        row(c.label, "preflight DeepSpeed peak", _pct(e), "±30%",
            abs(e) <= TARGET_DS_PRED if e is not None else None)  # fmt: skip
        if c.verify is not None:
            row(c.label, "inspector verify", f"exit {c.verify.rc}", "exit 0", c.verify.ok)
        if c.compare is not None:
            cmp = c.compare
            ok = not cmp["mismatched"] and not cmp["n_only_ours"] and not cmp["n_only_theirs"]
            measured = (
                f"{len(cmp['checked']) - len(cmp['mismatched'])}/{len(cmp['checked'])} tensors bit-exact, "
                f"{cmp['n_common']} common names, {cmp['n_only_ours']} only ours, "
                f"{cmp['n_only_theirs']} only DeepSpeed"
            )
            row(c.label, "ours == DeepSpeed", measured, "bit-exact, same names", ok)
        if c.ds is not None and not c.ds.ok:
            row(c.label, "DeepSpeed ran", f"exit {c.ds.rc}", "exit 0", None)
    for stage in s.stages:
        peaks = [
            (c.size, c.ours.peak_tree) for c in cases if c.stage == stage and c.ours is not None and c.ours.ok
        ]
        if len(peaks) >= 2:
            spread = max(p for _, p in peaks) - min(p for _, p in peaks)
            detail = " vs ".join(f"{sz} {_mib(p)}" for sz, p in peaks)
            row(f"ZeRO-{stage}", "peak flat across sizes", f"{_mib(spread)} ({detail})", "≤ 64 MiB",
                spread <= TARGET_FLAT)  # fmt: skip
    lines.append("")
    lines.append(
        f"Summary: {results.count('PASS')} PASS, {results.count('FAIL')} FAIL, {results.count('SKIP')} SKIP."
    )
    busy = [
        f"{c.label} {r.label.split('-')[0]} {r.other_load:.2f}"
        for c in cases
        for r in (c.floor_run, c.ours, c.verify, c.ours_module, c.ds)
        if r is not None and r.other_load > CONTENTION_CORES
    ]
    if busy:
        lines.append(
            f"**Warning:** other processes kept more than {CONTENTION_CORES} cores busy on average during "
            f"{len(busy)} timed run(s) ({', '.join(busy)}); their wall times (and ratios) are not reliable. "
            "Rerun on an idle machine."
        )

    other = [
        f"- {c.label}: checkpoint {format_bytes(c.ckpt_bytes)} on disk"
        + (
            " (reused from --keep)"
            if c.demo_reused
            else f", demo writer {c.demo.wall:.1f} s"
            if c.demo
            else ""
        )
        + (f"; preflight process {c.preflight.get('shards', '?')} shard(s)" if c.preflight else "")
        + (f"; our converter's own 'Done in' time {c.ours_internal_s:.1f} s" if c.ours_internal_s else "")
        for c in cases
        if c.ckpt_bytes
    ]
    problems = [f"- {c.label}: {err}" for c in cases for err in c.errors]
    if other or NOTES:
        lines += ["", "## Notes", "", *other, *(f"- {n}" for n in NOTES)]
    if problems:
        lines += ["", "## Errors", "", "```", *problems, "```"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------


def _probe(
    python: str, env: dict[str, str], code: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark zero-inspector convert against the I/O floor and DeepSpeed's zero_to_torch."
    )
    p.add_argument("--sizes", help=f"comma-separated parameter counts (default {','.join(DEFAULT_SIZES)})")
    p.add_argument("--stages", default=",".join(map(str, DEFAULT_STAGES)), help="comma-separated ZeRO stages")
    p.add_argument(
        "--workdir", help="where checkpoints and outputs go (default: a new folder under $TMPDIR or /tmp)"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the checkpoints (reused by the next run in --workdir)"
    )
    p.add_argument("--quick", action="store_true", help=f"smoke run with {','.join(QUICK_SIZES)} parameters")
    p.add_argument(
        "--cold", action="store_true", help="drop the page cache before every timed run (needs root)"
    )
    p.add_argument(
        "--fsync",
        action="store_true",
        help="pass --fsync to convert (if it has the option) and count fsync in the I/O floor",
    )
    p.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeed's zero_to_torch")
    p.add_argument("--results", default=str(HERE / "results.md"), help="markdown file to (over)write")
    p.add_argument("--timeout", type=float, default=2400, help="seconds before a single run is killed")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] in (["--_floor"], ["--_compare"]):  # child modes
        spec = json.loads(raw[1])
        result = floor_main(spec) if raw[0] == "--_floor" else compare_main(spec)
        print(json.dumps(result))
        return 0

    args = parse_args(raw)
    try:
        sizes = [
            x.strip()
            for x in (args.sizes or ",".join(QUICK_SIZES if args.quick else DEFAULT_SIZES)).split(",")
        ]
        for size in sizes:
            parse_size(size)
        stages = [int(x) for x in args.stages.split(",")]
        if any(st not in (1, 2, 3) for st in stages):
            raise ValueError("stages must be 1, 2 or 3")
    except ValueError as exc:
        print(f"bench: invalid --sizes/--stages: {exc}", file=sys.stderr)
        return 2

    if args.cold:
        try:
            _drop_caches()
        except OSError as exc:
            print(
                f"bench: --cold needs a writable {DROP_CACHES} (root, and not a read-only /proc as in most "
                f"containers): {exc}. Run without --cold to measure with a warm page cache.",
                file=sys.stderr,
            )
            return 2

    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["COLUMNS"] = "200"  # rich wraps at 80 columns when not on a terminal
    env["PYTHONUNBUFFERED"] = "1"
    if importlib.util.find_spec("inspector") is not None and str(REPO) in sys.path[:1]:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="zi-bench-")) if own else Path(args.workdir).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=workdir))
    status = 0
    try:
        convert_help = _probe(
            sys.executable, env, "from inspector.cli.main import main; main(['convert', '--help'])"
        )
        fsync_flag = "--fsync" in convert_help.stdout
        deepspeed = False
        if not args.no_deepspeed:
            probe = _probe(
                sys.executable, env, "import deepspeed.utils.zero_to_torch, safetensors, huggingface_hub"
            )
            deepspeed = probe.returncode == 0
            if not deepspeed:
                tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
                print(
                    f"bench: DeepSpeed's zero_to_torch is not importable ({tail}); skipping it.",
                    file=sys.stderr,
                )
        settings = Settings(
            sizes=sizes,
            stages=stages,
            workdir=workdir,
            own_workdir=own,
            keep=args.keep,
            cold=args.cold,
            # without a --fsync option, convert always fsyncs (stream.run), so the floor must too
            fsync=args.fsync if fsync_flag else True,
            fsync_flag=fsync_flag,
            deepspeed=deepspeed,
            results=Path(args.results),
            timeout=args.timeout,
        )
        header = machine_info(workdir)
        print("\n".join(header), flush=True)
        print(f"- Workdir: {workdir}", flush=True)
        bench = Bench(settings, Runner(logs, env, args.timeout))
        cases = [Case(stage, size) for size in sizes for stage in stages]
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            print(f"\n[{i + 1}/{len(cases)}] {case.label} ...", flush=True)
            try:
                bench.run_case(case)
            except BenchError as exc:
                case.errors.append(str(exc))
            if case.errors:
                status = 1
                for err in case.errors:
                    print(f"  error: {err}", file=sys.stderr, flush=True)
            summary = []
            for name, r in (
                ("floor", case.floor_run),
                ("ours", case.ours),
                ("verify", case.verify),
                ("ds", case.ds),
            ):
                if r is not None:
                    summary.append(
                        f"{name} {r.wall:.1f}s/{_mib(r.peak_tree)}/other load {r.other_load:.2f}"
                        + ("" if r.ok else " FAILED")
                    )
            print(f"  done in {time.perf_counter() - t0:.0f} s: {', '.join(summary)}", flush=True)
            settings.results.write_text(render(cases, settings, header, finished=i == len(cases) - 1))
        text = render(cases, settings, header, finished=True)
        print()
        print(text)
        settings.results.write_text(text)
        print(f"Wrote {settings.results}")
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        status = 130
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        status = 1
    finally:
        if args.keep:
            print(f"Kept checkpoints and logs in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(logs, ignore_errors=True)
            if own:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for p in workdir.glob("*-s[0-9]-*"):
                    if p.name.startswith(("ckpt-", "out-")):
                        shutil.rmtree(p, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
