"""One owner per output folder, signals and checksummed resume (issue 7.5, 7.6).

Two conversions into one folder used to delete each other's partial files and exit 0 with wrong output;
SIGTERM left partial files; resume trusted any finished shard of the right size and header. Ordering in
these tests comes from lines the child prints, never from sleeps or timed assertions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from inspector.convert.journal import JOURNAL
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.convert.root import LOCK, PARTIAL, OutputRoot
from inspector.convert.verify import run_verify
from inspector.demo.writer import DemoSpec
from inspector.errors import OutputError
from inspector.scan.scanner import scan
from tests.convert.jobs import execute, journalled, run

if TYPE_CHECKING:
    from conftest import DemoCache

REPO_ROOT = Path(__file__).resolve().parents[2]  # the worktree root (tests/convert/../..)
SPEC = DemoSpec(stage=3, world_size=2, dtype="bf16", params=400_000)
SHARD = "200000"

# A CLI run whose reads are slowed and announced, so the test can act while it is surely mid-run.
SLOW_CLI = """
import os, sys, threading, time
from inspector.convert.reader import FilePool
from inspector.cli.main import main
real = FilePool.read_into
calls = [0]
said = threading.Lock()  # the universal writer reads from several threads: one whole line per read
def slow(self, *a):
    with said:
        calls[0] += 1
        sys.stderr.write(f"read {calls[0]}\\n")
        sys.stderr.flush()
    time.sleep(0.02)
    while calls[0] >= 3 and os.path.exists(os.environ.get("ZI_GATE", "/nonexistent")):
        time.sleep(0.01)  # held mid-run until the test opens the gate
    return real(self, *a)
FilePool.read_into = slow
sys.exit(main(sys.argv[1:]))
"""


def slow_cli(
    tmp_path: Path, *args: str | os.PathLike[str], gate: Path | None = None
) -> subprocess.Popen[str]:
    """The CLI with slowed, announced reads; while `gate` exists it holds still after its third read."""
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    # the buffered path, so every read passes the hook (fp32 -> fp32 would otherwise be a kernel copy)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT),
        COLUMNS="200",
        NO_COLOR="1",
        TERM="dumb",
        ZI_NO_COPY_FILE_RANGE="1",
    )
    if gate is not None:
        env["ZI_GATE"] = str(gate)
    return subprocess.Popen(
        [sys.executable, str(script), *(os.fspath(a) for a in args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


def wait_for_reads(proc: subprocess.Popen[str], n: int) -> list[str]:
    """Consume the child's stderr until its n-th read; returns the other lines seen."""
    assert proc.stderr is not None
    other = []
    for line in proc.stderr:
        if line.startswith("read "):
            if int(line.split()[1]) >= n:
                return other
        else:
            other.append(line)
    raise AssertionError(f"the child ended before {n} reads: {''.join(other)}")


def convert_args(root: Path, out: Path) -> tuple[str, ...]:
    return ("convert", str(root), str(out), "--shard-size", SHARD, "--dtype", "fp32")


def verify_ok(root: Path, out: Path) -> None:
    result = None
    for ev in run_verify(scan(str(root)), str(out)):
        result = ev
    assert result is not None and getattr(result, "ok", False), result


def second_is_refused_while_held(
    tmp_path: Path,
    args: tuple[str, ...],
    second_args: tuple[str, ...],
    snapshot: Callable[[Path], list[Any]],
) -> None:
    """Runs `args` held mid-run, then `second_args` into the same OUT: the second is refused at once (exit 2,
    who holds it, no traceback) and changes nothing `snapshot` sees; the first then completes."""
    out = Path(args[2])
    gate = tmp_path / "gate"
    gate.touch()
    first = slow_cli(tmp_path, *args, gate=gate)
    try:
        wait_for_reads(first, 3)
        assert (out / LOCK).exists()
        before = snapshot(out)
        second = subprocess.run(
            [sys.executable, "-m", "inspector", *second_args],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), COLUMNS="300"),
            cwd=REPO_ROOT,
            timeout=120,
            check=False,
        )
        assert second.returncode == 2, second.stdout + second.stderr
        assert "Output folder in use" in second.stderr and f"process {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert snapshot(out) == before  # the first run is held still: nothing changed, nothing removed
        gate.unlink()
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert LOCK not in os.listdir(out)


def sigterm_mid_run(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM once the child has read 5 times; its stdout and stderr (it is killed if it does not end)."""
    try:
        wait_for_reads(proc, 5)
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_second_convert_into_a_busy_folder_is_refused(tmp_path: Path, demo: DemoCache) -> None:
    """While one convert runs, a second into the same folder is refused at once and touches nothing; the
    first completes with correct output."""
    root = demo(SPEC)
    out = tmp_path / "out"
    args = convert_args(root, out)
    second_is_refused_while_held(tmp_path, args, (*args, "--dtype", "bf16"), lambda p: sorted(os.listdir(p)))
    verify_ok(root, out)


def test_lock_is_exclusive_in_process(tmp_path: Path, demo: DemoCache) -> None:
    """The same refusal through the API (the TUI runs conversions in threads of one process)."""
    plan = build_plan(scan(str(demo(SPEC))), ConvertOptions(dtype="fp32", shard_size=int(SHARD)))
    out = tmp_path / "out"
    held = OutputRoot(str(out))  # another run holding OUT
    try:
        with pytest.raises(OutputError, match="Another conversion"):
            execute(plan, str(out))
        assert out.is_dir()  # the refused run removes nothing, not even the folder it found
    finally:
        held.release(ok=False)
    assert not out.exists()  # the holder created it and left it empty
    execute(plan, str(out))
    verify_ok(demo(SPEC), out)


def test_sigterm_cleans_up_like_ctrl_c(tmp_path: Path, demo: DemoCache) -> None:
    """SIGTERM mid-run: exit 130, the message, no partial files, the folder it created gone; a rerun works."""
    root = demo(SPEC)
    out = tmp_path / "deep" / "out"
    proc = slow_cli(tmp_path, *convert_args(root, out))
    stdout, stderr = sigterm_mid_run(proc)
    assert proc.returncode == 130, stdout + stderr
    assert "Interrupted" in stdout + stderr and "Traceback" not in stderr
    assert not (tmp_path / "deep").exists()
    execute(build_plan(scan(str(root)), ConvertOptions(dtype="fp32", shard_size=int(SHARD))), str(out))
    verify_ok(root, out)


def test_failed_run_keeps_a_folder_it_did_not_create(tmp_path: Path, demo: DemoCache) -> None:
    plan = build_plan(scan(str(demo(SPEC))), ConvertOptions(dtype="fp32", shard_size=int(SHARD)))
    out = tmp_path / "out"
    out.mkdir()
    events = run(plan, str(out))
    next(events)
    events.close()  # the consumer gives up (cancel in a UI)
    assert out.is_dir() and os.listdir(out) == []


def kill_after_first_shard(tmp_path: Path, root: Path, out: Path) -> dict[str, object]:
    """SIGKILL a convert once its journal lists a finished shard; returns that journal."""
    proc = slow_cli(tmp_path, *convert_args(root, out))
    try:
        for n in range(1, 10_000):
            wait_for_reads(proc, n)
            try:
                journal = journalled(out / JOURNAL)
            except OSError:
                continue
            if journal.get("complete"):
                proc.kill()
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return journal


@pytest.mark.parametrize("damage", ["flip-a-byte", "zero-a-page"])
def test_damaged_finished_shard_is_rewritten_on_resume(tmp_path: Path, demo: DemoCache, damage: str) -> None:
    """A shard the journal calls finished, damaged after the kill (size and header intact): its CRC-32 no
    longer matches, so the rerun writes it again instead of trusting it; the output verifies."""
    root = demo(SPEC)
    out = tmp_path / "out"
    journal = kill_after_first_shard(tmp_path, root, out)
    name = journal["complete"][0]  # type: ignore[index]
    sums = journal["crc32"]
    assert isinstance(sums, dict) and name in sums
    partial = out / (name + PARTIAL)
    assert zlib.crc32(partial.read_bytes()) == sums[name]
    data = bytearray(partial.read_bytes())
    middle = len(data) // 2
    if damage == "flip-a-byte":
        data[middle] ^= 0x01
    else:
        data[middle - 2048 : middle + 2048] = bytes(4096)  # what a crash before writeback can leave
    partial.write_bytes(bytes(data))
    plan = build_plan(scan(str(root)), ConvertOptions(dtype="fp32", shard_size=int(SHARD)))
    shard = next(s for s in plan.shards if s.filename == name)
    raw = partial.read_bytes()  # size and header would pass; the checksum does not
    assert len(raw) == shard.file_bytes and raw.startswith(shard.header) and zlib.crc32(raw) != sums[name]
    report = execute(plan, str(out))
    assert report.resumed_shards == len(journal["complete"]) - 1  # type: ignore[arg-type]
    verify_ok(root, out)
    assert not [n for n in os.listdir(out) if n.endswith(PARTIAL) or n.startswith(JOURNAL) or n == LOCK]


def test_intact_finished_shards_are_reused(tmp_path: Path, demo: DemoCache) -> None:
    root = demo(SPEC)
    out = tmp_path / "out"
    journal = kill_after_first_shard(tmp_path, root, out)
    plan = build_plan(scan(str(root)), ConvertOptions(dtype="fp32", shard_size=int(SHARD)))
    report = execute(plan, str(out))
    assert report.resumed_shards == len(journal["complete"]) >= 1  # type: ignore[arg-type]
    verify_ok(root, out)


# ------------------------------------------------------------------- universal checkpoints share the lock


def _tree(path: Path) -> list[tuple[str, int]]:
    return sorted(
        (os.path.relpath(os.path.join(d, n), path), os.path.getsize(os.path.join(d, n)))
        for d, _, names in os.walk(path)
        for n in names
    )


def _universal_args(root: Path, out: Path) -> tuple[str, ...]:
    return ("convert", str(root), str(out), "--format", "universal")


def test_second_universal_convert_into_a_busy_folder_is_refused(tmp_path: Path, demo: DemoCache) -> None:
    """Two `--format universal` runs into one OUT: the second is refused with the safetensors path's message
    and leaves the first's staging folder alone; the first completes and verifies."""
    root = demo(SPEC)
    out = tmp_path / "out"
    args = _universal_args(root, out)
    second_is_refused_while_held(tmp_path, args, args, _tree)
    from inspector.cli.main import main

    assert main(["verify", str(root), str(out)]) == 0


def test_universal_lock_is_exclusive_in_process(tmp_path: Path, demo: DemoCache) -> None:
    """write_universal takes the same lock as the safetensors path (the TUI runs both in threads)."""
    from inspector.convert.kinds.universal.plan import plan_universal
    from tests.convert.jobs import universal as write_universal

    plan = plan_universal(scan(str(demo(SPEC))), str(tmp_path / "out"))
    held = OutputRoot(str(tmp_path / "out"))
    try:
        with pytest.raises(OutputError, match="Another conversion"):
            write_universal(plan)
        assert os.listdir(tmp_path / "out") == [LOCK]
    finally:
        held.release(ok=False)
    assert not (tmp_path / "out").exists()
    write_universal(plan)
    assert LOCK not in os.listdir(tmp_path / "out")


def test_sigterm_stops_a_universal_convert_like_ctrl_c(tmp_path: Path, demo: DemoCache) -> None:
    """SIGTERM mid-run: exit 130 with a message, no traceback, the lock and half-written files gone; the
    same command then resumes from the finished files and the output verifies."""
    root = demo(SPEC)
    out = tmp_path / "out"
    proc = slow_cli(tmp_path, *_universal_args(root, out))
    stdout, stderr = sigterm_mid_run(proc)
    assert proc.returncode == 130, stdout + stderr
    assert "Interrupted" in stdout + stderr and "resume" in stdout + stderr
    assert "Traceback" not in stderr
    names = [n for n, _ in _tree(out)]
    assert LOCK not in names and not [n for n in names if n.endswith(".tmp")], names
    from inspector.cli.main import main

    assert main(list(_universal_args(root, out))) == 0
    assert main(["verify", str(root), str(out)]) == 0
