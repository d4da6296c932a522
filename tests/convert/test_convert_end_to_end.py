"""A conversion end to end on demo checkpoints (the weights kind on the one executor): exact bytes, verify,
output-folder rules, failure and resume.

Every converted tensor must equal, bit for bit, what DeepSpeed's reconstruction returns (`expected()`) cast
to the output dtype. Failures of every kind (cancel, read error, disk full, SIGKILL) must leave no file that
looks finished, and a hard-killed job must complete when the same command is run again.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import safetensors.torch
import torch

from inspector.convert.executor import Progress, Report
from inspector.convert.journal import JOURNAL, Journal
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import INDEX_NAME, SINGLE_NAME, ConversionPlan, build_plan
from inspector.convert.reader import FilePool
from inspector.convert.root import LOCK, PARTIAL
from inspector.convert.verify import VerifyResult, run_verify
from inspector.demo.writer import DemoSpec, expected
from inspector.errors import CancelledError, CorruptFileError, OutputError
from inspector.format.dtypes import torch_dtype
from inspector.scan.model import Checkpoint
from inspector.scan.scanner import scan
from tests.convert.jobs import execute, journalled, run

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

REPO_ROOT = Path(__file__).resolve().parents[2]
BF16 = DemoSpec(stage=2, world_size=2, dtype="bf16", params=100_000)
FINAL = re.compile(r"^model.*\.safetensors$|^model\.safetensors\.index\.json$")

# (spec, output dtype, chunk elements, shard size): every stage, training dtype and output dtype, world
# sizes 1-8, chunks that straddle segment and rank boundaries, single files and many shards.
CASES = [
    (DemoSpec(stage=1, world_size=1, dtype="bf16", params=60_000), "fp32", 1000, 100_000),
    (DemoSpec(stage=1, world_size=3, dtype="fp16", params=80_000), "auto", 1000, 5_000_000_000),
    (DemoSpec(stage=1, world_size=4, dtype="bf16", params=90_000, bf16_optimizer=True), "bf16", 333, 60_000),
    (BF16, "fp16", 777, 50_000),
    (DemoSpec(stage=2, world_size=5, dtype="fp32", params=60_000), "bf16", 1000, 5_000_000_000),
    (DemoSpec(stage=2, world_size=8, dtype="bf16", params=120_000, frozen=False), "fp32", 4096, 100_000),
    (DemoSpec(stage=3, world_size=2, dtype="fp16", params=80_000), "fp32", 1000, 70_000),
    (
        DemoSpec(stage=3, world_size=3, dtype="bf16", params=100_000, sub_group_size=4_000),
        "auto",
        1000,
        40_000,
    ),
    (
        DemoSpec(stage=3, world_size=6, dtype="fp32", params=60_000, sub_group_size=2_500, tied=False),
        "fp16",
        999,
        5_000_000_000,
    ),
]


def case_id(case: tuple[DemoSpec, str, int, int]) -> str:
    s, dtype, chunk, shard = case
    opt = "-bf16opt" if s.bf16_optimizer else ""
    return f"s{s.stage}-ws{s.world_size}-{s.dtype}{opt}-to-{dtype}-chunk{chunk}-shard{shard}"


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so comparisons are bit for bit (-0.0 != 0.0, NaN == same NaN)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def to_torch(a: np.ndarray[Any, Any]) -> torch.Tensor:
    """A numpy array (ml_dtypes bf16 included) as a torch tensor with the same bits and dtype."""
    raw = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy())
    return raw.view(torch_dtype(str(a.dtype))).reshape(a.shape)


def load_output(out: Path) -> dict[str, torch.Tensor]:
    """Every tensor in the folder, through safetensors itself (index or single file)."""
    index = out / INDEX_NAME
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [SINGLE_NAME]
    )
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        part = safetensors.torch.load_file(str(out / f))
        assert not set(part) & set(tensors), f"{f} repeats tensors"
        tensors.update(part)
    return tensors


def assert_matches_expected(spec: DemoSpec, plan: ConversionPlan, out: Path) -> None:
    """Each output tensor equals DeepSpeed's value cast to its output dtype; integers are unchanged."""
    got = load_output(out)
    planned = [t for s in plan.shards for t in s.tensors]
    assert set(got) == {t.name for t in planned}
    for t in planned:
        want = to_torch(expected(spec, t.source)).to(torch_dtype(t.out_dtype))  # torch casts the reference
        g = got[t.name]
        assert g.dtype == want.dtype and g.shape == want.shape, t.name
        assert torch.equal(bits(g), bits(want)), f"{t.name} differs"
        if not want.is_floating_point():
            assert torch.equal(g, to_torch(expected(spec, t.source))), t.name
    if "model.tokens_seen" in got:
        assert got["model.tokens_seen"].dtype == torch.int64
        assert int(got["model.tokens_seen"]) == 12_345


def verify(ckpt: Checkpoint, out: Path, chunk_elems: int = 1 << 22) -> VerifyResult:
    result = None
    for ev in run_verify(ckpt, str(out), chunk_elems=chunk_elems):
        if isinstance(ev, VerifyResult):
            result = ev
    assert result is not None
    return result


def listing(path: Path) -> dict[str, bytes]:
    """Names and contents of a folder's files, to prove nothing was touched."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def bf16_ckpt(demo: DemoCache) -> Checkpoint:
    return scan(str(demo(BF16)))


def small_plan(ckpt: Checkpoint, **kw: Any) -> ConversionPlan:
    """Small chunks and shards, so every run has many chunks and several shards."""
    opts: dict[str, Any] = {"chunk_elems": 1000, "shard_size": 60_000}
    opts.update(kw)
    return build_plan(ckpt, ConvertOptions(**opts))


# --- exact output ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_convert_matches_deepspeed(
    demo: DemoCache, tmp_path: Path, case: tuple[DemoSpec, str, int, int]
) -> None:
    spec, dtype, chunk, shard = case
    ckpt = scan(str(demo(spec)))
    assert any(len(t.segments) > 1 for t in ckpt.tensors) or spec.world_size == 1
    plan = build_plan(ckpt, ConvertOptions(dtype=dtype, chunk_elems=chunk, shard_size=shard))
    out = tmp_path / "out"
    report = execute(plan, str(out))
    assert sorted(os.listdir(out)) == sorted(plan.filenames)
    assert report.tensors == plan.tensor_count == len(ckpt.tensors)
    assert dict(report.files) == {f: (out / f).stat().st_size for f in plan.filenames}
    assert report.bytes_written == plan.output_bytes == sum((out / f).stat().st_size for f in plan.filenames)
    if plan.index is not None:
        assert (out / INDEX_NAME).read_bytes() == plan.index
    assert_matches_expected(spec, plan, out)
    result = verify(ckpt, out, chunk_elems=chunk)
    assert result.ok, result
    assert result.checked == plan.tensor_count


def test_dedupe_renames_and_keep_fp32(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    """Deduped alias absent from the files, renamed names written, and verify still maps everything back."""
    plan = small_plan(
        bf16_ckpt,
        dedupe_tied=True,
        strip_prefix=("model.",),
        renames=((r"^lm_head", "head"),),
        keep_fp32=("*norm*",),
    )
    out = tmp_path / "out"
    execute(plan, str(out))
    got = load_output(out)
    assert "head.weight" not in got and "lm_head.weight" not in got
    assert "embed_tokens.weight" in got
    assert got["norm.weight"].dtype == torch.float32
    assert got["layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert_matches_expected(BF16, plan, out)
    result = verify(bf16_ckpt, out)
    assert result.ok, result
    assert result.missing == [] and result.notes == []


def test_filtered_output_verifies_with_a_note(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    plan = small_plan(bf16_ckpt, include=("model.layers.1",), exclude_buffers=True)
    out = tmp_path / "out"
    execute(plan, str(out))
    assert_matches_expected(BF16, plan, out)
    result = verify(bf16_ckpt, out)
    assert result.ok, result
    assert result.notes and "left out" in result.notes[0]


# --- verify catches damage -----------------------------------------------------------------------------------


def test_flipped_byte_fails_verify(
    bf16_ckpt: Checkpoint, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    plan = small_plan(bf16_ckpt)
    out = tmp_path / "out"
    execute(plan, str(out))
    ok = cli("verify", bf16_ckpt.root, out)
    assert ok.rc == 0, ok.output
    assert "OK" in ok.stdout

    shard = plan.shards[1]
    victim = shard.tensors[len(shard.tensors) // 2]
    path = out / shard.filename
    pos = len(shard.header) + victim.offset + victim.nbytes // 2
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))

    result = verify(bf16_ckpt, out)
    assert not result.ok
    assert result.mismatched == [victim.name]
    bad = cli("verify", bf16_ckpt.root, out)
    assert bad.rc == 1, bad.output
    assert victim.name in bad.stdout and "Mismatched" in bad.stdout
    assert "Traceback" not in bad.output


def test_truncated_output_fails_verify(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    """A cut-off shard (say, an interrupted copy) is a verify failure naming the file, not a crash."""
    plan = small_plan(bf16_ckpt)
    out = tmp_path / "out"
    execute(plan, str(out))
    shard = plan.shards[1]
    cut = len(shard.header) + shard.tensors[-1].offset + 1
    os.truncate(out / shard.filename, cut)
    result = verify(bf16_ckpt, out)
    assert not result.ok
    assert result.mismatched == [f"{shard.tensors[-1].name} ({shard.filename} is truncated)"]


# --- output folder rules -------------------------------------------------------------------------------------


def test_non_empty_folder_is_refused_untouched(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = listing(out)
    with pytest.raises(OutputError, match="not empty") as exc:
        execute(small_plan(bf16_ckpt), str(out))
    assert "--overwrite" in exc.value.hint
    assert listing(out) == before


def test_earlier_conversion_is_refused_without_overwrite(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    out = tmp_path / "out"
    execute(small_plan(bf16_ckpt), str(out))
    before = listing(out)
    with pytest.raises(OutputError, match="not empty"):
        execute(small_plan(bf16_ckpt, dtype="fp32"), str(out))
    assert listing(out) == before


def test_output_path_that_is_a_file_is_refused(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"x")
    with pytest.raises(OutputError, match="not a folder"):
        execute(small_plan(bf16_ckpt), str(target), overwrite=True)
    assert target.read_bytes() == b"x"


def test_overwrite_replaces_ours_and_keeps_user_files(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    """--overwrite: new shards in, stale shards of another shard count and a stale index out, rest kept."""
    out = tmp_path / "out"
    first = small_plan(bf16_ckpt, shard_size=30_000)
    execute(first, str(out))
    (out / "config.json").write_text("{}")
    (out / "model-card.md").write_text("# card")
    user = {"config.json": b"{}", "model-card.md": b"# card"}

    second = small_plan(bf16_ckpt, shard_size=80_000, dtype="fp32")
    assert 1 < len(second.shards) != len(first.shards)
    report = execute(second, str(out), overwrite=True)
    assert sorted(os.listdir(out)) == sorted([*second.filenames, *user])
    assert set(report.removed_stale) == set(first.filenames) - set(second.filenames)
    assert_matches_expected(BF16, second, out)
    assert verify(bf16_ckpt, out).ok

    third = small_plan(bf16_ckpt, shard_size=10**12)
    report = execute(third, str(out), overwrite=True)
    assert sorted(os.listdir(out)) == sorted([SINGLE_NAME, *user])
    assert INDEX_NAME in report.removed_stale
    assert_matches_expected(BF16, third, out)
    assert {n: (out / n).read_bytes() for n in user} == user


def test_checkpoint_tag_folder_is_refused(demo: DemoCache, tmp_path: Path) -> None:
    root = demo.copy(BF16, tmp_path / "ckpt")
    ckpt = scan(str(root))
    tag_dir = Path(ckpt.tag_dir)
    before = listing(tag_dir)
    for target in (tag_dir, root / "link-to-tag"):
        if target != tag_dir:
            target.symlink_to(tag_dir)
        with pytest.raises(OutputError, match="tag folder"):
            execute(small_plan(ckpt), str(target), overwrite=True)
    assert listing(tag_dir) == before


# --- cancel and failures leave a clean folder ----------------------------------------------------------------


def test_cancel_from_progress_loop(bf16_ckpt: Checkpoint, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cancel = threading.Event()
    seen = 0
    with pytest.raises(CancelledError):
        for ev in run(small_plan(bf16_ckpt), str(out), cancel=cancel):
            assert not isinstance(ev, Report), "the run finished despite the cancel"
            seen += 1
            cancel.set()
    assert seen == 1
    assert not out.exists(), os.listdir(out)  # the run created it, so it removes it


def test_read_error_mid_run_cleans_up(
    bf16_ckpt: Checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source read failing on the 3rd read (partial file and journal already there) leaves nothing."""
    fail_at = 3
    out = tmp_path / "out"
    real = FilePool.read_into
    calls = [0]
    at_failure: list[str] = []

    def flaky(self: FilePool, path: str, offset: int, view: memoryview) -> None:
        calls[0] += 1
        if calls[0] == fail_at:
            at_failure.extend(os.listdir(out))
            raise CorruptFileError(f"{path}: simulated read failure")
        real(self, path, offset, view)

    monkeypatch.setattr(FilePool, "read_into", flaky)
    with pytest.raises(CorruptFileError, match="simulated"):
        execute(small_plan(bf16_ckpt, shard_size=20_000), str(out))
    assert any(n.endswith(PARTIAL) for n in at_failure) and JOURNAL in at_failure, at_failure
    assert not out.exists(), os.listdir(out)  # the run created it, so it removes it


def test_read_error_after_a_completed_shard(
    bf16_ckpt: Checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail only once the journal records a finished shard: that shard's partial must go too."""
    out = tmp_path / "out"
    real = FilePool.read_into
    at_failure: dict[str, Any] = {}

    def flaky(self: FilePool, path: str, offset: int, view: memoryview) -> None:
        journal = out / JOURNAL
        if journal.exists():
            done = journalled(journal)["complete"]
            if done:
                at_failure["done"] = done
                at_failure["files"] = os.listdir(out)
                raise CorruptFileError(f"{path}: simulated read failure")
        real(self, path, offset, view)

    monkeypatch.setattr(FilePool, "read_into", flaky)
    with pytest.raises(CorruptFileError, match="simulated"):
        execute(small_plan(bf16_ckpt, shard_size=20_000), str(out))
    assert at_failure["done"], "no shard finished before the failure"
    assert f"{at_failure['done'][0]}{PARTIAL}" in at_failure["files"]
    assert not out.exists(), os.listdir(out)  # the run created it, so it removes it


def _enospc(*_a: object, **_k: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["posix_fallocate", "pwrite", "pwrite-late", "journal"])
def test_disk_full(
    bf16_ckpt: Checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """ENOSPC anywhere (preallocation, header, a writer-thread write, the journal) -> 'Disk full', clean folder."""
    out = tmp_path / "out"
    plan = small_plan(bf16_ckpt, shard_size=20_000)
    if where == "posix_fallocate":
        monkeypatch.setattr(os, "posix_fallocate", _enospc)
    elif where == "journal":
        monkeypatch.setattr(Journal, "start", lambda self, kept: _enospc())
    else:
        real = os.pwrite
        calls = [0]
        fail_at = 1 if where == "pwrite" else 25

        def pwrite(fd: int, data: Any, offset: int) -> int:
            calls[0] += 1
            if calls[0] >= fail_at:
                _enospc()
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(OutputError) as exc:
        execute(plan, str(out))
    assert exc.value.title == "Disk full"
    assert "Disk full" in exc.value.message and f"needs {plan.output_bytes:,} bytes" in exc.value.message
    assert "Free disk space" in exc.value.hint
    assert not out.exists(), os.listdir(out)  # the run created it, so it removes it


def test_source_truncated_after_scan(demo: DemoCache, tmp_path: Path) -> None:
    """A file that shrinks (or vanishes) between scan and convert: a clear error and nothing left."""
    root = demo.copy(BF16, tmp_path / "ckpt")
    ckpt = scan(str(root))
    optim = sorted(f.path for f in ckpt.files if f.role == "optim")
    os.truncate(optim[-1], os.path.getsize(optim[-1]) // 2)
    os.unlink(optim[0])
    out = tmp_path / "out"
    with pytest.raises(CorruptFileError) as exc:
        execute(small_plan(ckpt), str(out))
    assert os.path.basename(optim[0]) in exc.value.message or "truncated" in exc.value.message
    assert not out.exists(), os.listdir(out)  # the run created it, so it removes it


def test_cli_convert_of_truncated_checkpoint(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(BF16, tmp_path / "ckpt")
    ckpt = scan(str(root))
    victim = sorted(f.path for f in ckpt.files if f.role == "optim")[-1]
    os.truncate(victim, os.path.getsize(victim) // 2)
    out = tmp_path / "out"
    res = cli("convert", root, out)
    assert res.rc != 0, res.output
    assert "Traceback" not in res.output
    assert os.path.basename(victim) in res.output
    assert "truncated" in res.output
    assert not out.exists() or not [n for n in os.listdir(out) if FINAL.match(n)]


# --- progress -------------------------------------------------------------------------------------------------


def test_progress_events(bf16_ckpt: Checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowed reads make a >1 s run: events come at most ~4/s, grow monotonically and end at the total."""
    real = FilePool.read_into

    def slow(self: FilePool, path: str, offset: int, view: memoryview) -> None:
        time.sleep(0.01)
        real(self, path, offset, view)

    monkeypatch.setattr(FilePool, "read_into", slow)
    plan = small_plan(bf16_ckpt, workers=1)  # one reader: the sleeps add up
    total = sum(s.file_bytes for s in plan.shards)
    events: list[Progress] = []
    start = time.monotonic()
    report = None
    for ev in run(plan, str(tmp_path / "out")):
        if isinstance(ev, Progress):
            events.append(ev)
        else:
            report = ev
    wall = time.monotonic() - start
    assert isinstance(report, Report)
    assert wall > 1.0, "the run was too quick to say anything about the rate"
    assert 3 <= len(events) <= 4 * wall + 2
    gaps = [b.elapsed - a.elapsed for a, b in itertools.pairwise(events[:-1])]  # the last one is final
    assert all(g >= 0.24 for g in gaps), gaps
    done = [e.bytes_done for e in events]
    assert done == sorted(done)
    assert all(e.bytes_total == total for e in events)
    assert events[-1].bytes_done == total and events[-1].fraction == 1.0
    assert [e.shard_index for e in events] == sorted(e.shard_index for e in events)


# --- hard kill and resume ------------------------------------------------------------------------------------

JOB_SCRIPT = """
import os, sys, time
from inspector.scan.scanner import scan
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.convert.executor import Progress
from tests.convert.jobs import run

delay = float(os.environ.get("ZI_TEST_READ_DELAY", "0"))
if delay:  # the first run is slowed down so the kill surely lands mid-run
    os.environ["ZI_NO_COPY_FILE_RANGE"] = "1"  # fp32 -> fp32 would bypass the slowed reads
    from inspector.convert.reader import FilePool
    real = FilePool.read_into
    def slow(self, *a):
        time.sleep(delay)
        return real(self, *a)
    FilePool.read_into = slow
root, out, shard, chunk = sys.argv[1:]
plan = build_plan(scan(root), ConvertOptions(dtype="fp32", shard_size=int(shard), chunk_elems=int(chunk)))
for ev in run(plan, out):
    if isinstance(ev, Progress):
        print(f"progress {ev.shard_index} {ev.bytes_done} {ev.bytes_total}", flush=True)
    else:
        print(f"done resumed={ev.resumed_shards} shards={len(plan.shards)}", flush=True)
"""
KILL_SPEC = DemoSpec(stage=3, world_size=2, dtype="bf16", params=400_000)


def _job(script: Path, root: Path, out: Path, delay: float) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), ZI_TEST_READ_DELAY=str(delay), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(out), "200000", "4096"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


def _lines(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stdout is not None
    yield from proc.stdout


def _journalled_any(path: Path) -> bool:
    """Whether the journal at `path` records at least one finished file yet."""
    return path.exists() and bool(journalled(path)["complete"])


@pytest.mark.parametrize("kill_when", ["first-line", "after-a-shard"])
def test_sigkill_then_rerun_resumes(demo: DemoCache, tmp_path: Path, kill_when: str) -> None:
    """SIGKILL mid-run leaves no finished-looking file; the same command then completes and verifies."""
    root = demo(KILL_SPEC)
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    out = tmp_path / "out"
    proc = _job(script, root, out, delay=0.01)
    try:
        killed_at = None
        for line in _lines(proc):
            assert not line.startswith("done"), "the job finished before it could be killed"
            if line.startswith("progress"):
                shard = int(line.split()[1])
                # shards are written side by side, so a later shard's progress does not mean an earlier one
                # is finished: "after a shard" waits until the journal records one
                if kill_when == "first-line" or _journalled_any(out / JOURNAL):
                    os.kill(proc.pid, signal.SIGKILL)
                    killed_at = shard
                    break
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed_at is not None, proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == -signal.SIGKILL
    left = os.listdir(out)
    assert not [n for n in left if FINAL.match(n)], left
    assert all(n.endswith(PARTIAL) or n.startswith(JOURNAL) or n == LOCK for n in left), left  # flock died
    journal = journalled(out / JOURNAL)
    if kill_when == "after-a-shard":
        assert journal["complete"], "a shard was finished before the kill"

    rerun = _job(script, root, out, delay=0)
    stdout, stderr = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, stderr
    m = re.search(r"done resumed=(\d+) shards=(\d+)", stdout)
    assert m, stdout
    resumed, shards = int(m.group(1)), int(m.group(2))
    assert shards > 2
    assert resumed == len(journal["complete"])
    if kill_when == "after-a-shard":
        assert resumed >= 1
    ckpt = scan(str(root))
    result = verify(ckpt, out)
    assert result.ok, result
    assert not [n for n in os.listdir(out) if n.endswith(PARTIAL) or n.startswith(JOURNAL) or n == LOCK]


# --- CLI ------------------------------------------------------------------------------------------------------


def test_cli_convert_non_tty(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """In a pipe: plain progress lines, a summary, exit 0, and the files on disk."""
    out = tmp_path / "out"
    res = cli("convert", demo(BF16), out, "--shard-size", "60KB", "--dtype", "fp32")
    assert res.rc == 0, res.output
    assert "Traceback" not in res.output
    assert re.search(r"\[\s*\d+\.\d%\] .* / .*ETA .*files \d+/\d+", res.stdout), res.stdout
    assert "Done" in res.stdout and "tensors" in res.stdout
    files = sorted(os.listdir(out))
    assert INDEX_NAME in files and len(files) > 2
    for f in files:
        assert f in res.stdout
    ckpt = scan(str(demo(BF16)))
    plan = build_plan(ckpt, ConvertOptions(dtype="fp32", shard_size=60_000))
    assert files == sorted(plan.filenames)
    assert_matches_expected(BF16, plan, out)


def test_cli_convert_refuses_busy_folder(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    res = cli("convert", demo(BF16), out)
    assert res.rc == 2, res.output
    assert "not empty" in res.output and "--overwrite" in res.output
    assert "Traceback" not in res.output
    assert os.listdir(out) == ["keep.txt"]


def test_failure_after_renames_leaves_no_shards_without_index(
    tmp_path: Path, demo: DemoCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If writing the index fails once shards were renamed into place, those shards go too: a sharded
    output without its index would look loadable to a glob and is not."""
    ckpt = scan(str(demo(DemoSpec(stage=2, params=60_000))))
    plan = build_plan(ckpt, ConvertOptions(shard_size=50_000))
    assert plan.index is not None
    real_replace = os.replace

    def failing_replace(src: str, dst: str, **kw: Any) -> None:
        if dst.endswith(INDEX_NAME):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", failing_replace)
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="Disk full"):
        execute(plan, str(out))
    assert not out.exists(), os.listdir(out)  # the run created it, so it removes it


def test_verify_defaults_to_the_tag_the_output_was_converted_from(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """An output converted from a non-latest tag verifies without --tag (it used to compare with `latest`
    and report every tensor as mismatched); naming the other tag still compares with that one."""
    from inspector.demo.writer import DemoSpec, write_demo

    root = tmp_path / "run"
    write_demo(str(root), DemoSpec(params=30_000, tag="global_step3"))
    write_demo(str(root), DemoSpec(params=60_000, tag="global_step5"))  # `latest`; other shapes
    out = tmp_path / "out"
    assert cli("convert", root, out, "--tag", "global_step3").rc == 0
    ok = cli("verify", root, out)
    assert ok.rc == 0, ok.output
    other = cli("verify", root, out, "--tag", "global_step5")
    assert other.rc == 1 and "Mismatched" in other.output, other.output
    assert (root / "latest").read_text() == "global_step5"
