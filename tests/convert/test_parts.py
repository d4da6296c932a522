"""`convert --part I/N`: N runs side by side into one folder, each writing its share of the shards; the same
command without --part then finishes the folder, reusing every part's shards, byte-identical to one run."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.executor import Report
from inspector.convert.journal import JOURNAL
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.convert.root import LOCK, PARTIAL, OutputRoot
from inspector.convert.staging import part_indices
from inspector.demo.writer import DemoSpec
from inspector.errors import OutputError
from inspector.scan.scanner import scan
from tests.convert.jobs import execute, run

SPEC = DemoSpec(stage=3, world_size=2, dtype="bf16", params=300_000)
OPTS = ConvertOptions(shard_size=60_000)


def _report(events: Any) -> Report:
    return [ev for ev in events if isinstance(ev, Report)][-1]


def crc_reads_from_now(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every file the executor reads back for its CRC-32 from here on (`staging.fd_crc32`, counted)."""
    import inspector.convert.staging as staging

    reads: list[int] = []
    real = staging.fd_crc32

    def counted(fd: int) -> int:
        reads.append(fd)
        return real(fd)

    monkeypatch.setattr(staging, "fd_crc32", counted)
    return reads


def _same_folders(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all(filecmp.cmp(a / n, b / n, shallow=False) for n in names), names


@pytest.mark.parametrize("n", [1, 2, 3, 7, 40])
def test_every_shard_belongs_to_exactly_one_part(demo: Any, n: int) -> None:
    plan = build_plan(scan(str(demo(SPEC))), OPTS)
    owned = [k for i in range(n) for k in part_indices([s.file_bytes for s in plan.shards], (i, n))]
    assert sorted(owned) == list(range(len(plan.shards)))


def test_parts_then_finish_equal_one_run(demo: Any, tmp_path: Path) -> None:
    plan = build_plan(scan(str(demo(SPEC))), OPTS)
    assert len(plan.shards) >= 4
    execute(plan, str(tmp_path / "one"))
    out = tmp_path / "parts"
    n = 3
    for i in range(n):
        report = _report(run(plan, str(out), part=(i, n)))
        assert report.resumed_shards == 0 and all(name.endswith(PARTIAL) for name, _ in report.files)
    assert not (out / "model.safetensors.index.json").exists()  # nothing is published by a part
    final = _report(run(plan, str(out)))
    assert final.resumed_shards == len(plan.shards)  # nothing rewritten
    _same_folders(out, tmp_path / "one")
    assert not [p for p in os.listdir(out) if p.startswith((JOURNAL, LOCK)) or p.endswith(PARTIAL)]


def test_a_damaged_part_shard_is_rewritten_by_the_finishing_run(demo: Any, tmp_path: Path) -> None:
    plan = build_plan(scan(str(demo(SPEC))), OPTS)
    execute(plan, str(tmp_path / "one"))
    out = tmp_path / "parts"
    for i in range(2):
        _report(run(plan, str(out), part=(i, 2)))
    victim = out / (plan.shards[0].filename + PARTIAL)
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0x01
    victim.write_bytes(bytes(raw))
    final = _report(run(plan, str(out)))
    assert final.resumed_shards == len(plan.shards) - 1
    _same_folders(out, tmp_path / "one")


@pytest.mark.parametrize("fsync", [False, True])
@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_the_finishing_run_checks_every_staged_shard(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool, damage: str
) -> None:
    """The finishing run (one node) compares every staged shard with the CRC-32 its part journalled before
    publishing it, with or without --fsync: a shard changed after its part finished (one byte flipped in the
    middle keeps its size and header) is caught and rewritten, never published with exit 0."""
    plan = build_plan(scan(str(demo(SPEC))), OPTS)
    execute(plan, str(tmp_path / "one"))
    out = tmp_path / "parts"
    for i in range(2):
        _report(run(plan, str(out), part=(i, 2), fsync=fsync))
    victim = out / (plan.shards[1].filename + PARTIAL)
    raw = bytearray(victim.read_bytes())
    if damage == "cut":
        del raw[-1]
    else:
        raw[len(raw) // 2 + 1] ^= 0x40
    victim.write_bytes(bytes(raw))
    reads = crc_reads_from_now(monkeypatch)
    final = _report(run(plan, str(out)))
    assert final.resumed_shards == len(plan.shards) - 1  # the changed one is rewritten either way
    # every intact-looking shard is read back; the cut one fails on its size before its CRC is read
    assert len(reads) == len(plan.shards) - (1 if damage == "cut" else 0)
    _same_folders(out, tmp_path / "one")


def test_the_finishing_run_waits_for_every_part(demo: Any, tmp_path: Path) -> None:
    plan = build_plan(scan(str(demo(SPEC))), OPTS)
    out = tmp_path / "out"
    _report(run(plan, str(out), part=(0, 2)))
    running = OutputRoot(str(out), lock_name=LOCK + ".part-1-of-2")  # part 1 still at work
    try:
        with pytest.raises(OutputError, match=r"part 1 of 2"):
            _report(run(plan, str(out)))
        _report(run(plan, str(out), part=(0, 2)))  # parts run side by side: another part is not refused
    finally:
        running.release(ok=True)
    _report(run(plan, str(out), part=(1, 2)))
    assert _report(run(plan, str(out))).resumed_shards == len(plan.shards)


def test_parts_as_separate_processes_at_once(demo: Any, tmp_path: Path) -> None:
    """What a Slurm array does: N processes started together into one folder, then the finishing command."""
    root = demo(SPEC)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "inspector", "convert", str(root), str(out), "--shard-size", "60000"]
    procs = [
        subprocess.Popen(
            [*args, "--part", f"{i}/4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stdout + stderr
        assert "without --part" in stdout
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    one = subprocess.run(
        [*args[:5], str(tmp_path / "one"), "--shard-size", "60000"], capture_output=True, text=True
    )
    assert one.returncode == 0
    _same_folders(out, tmp_path / "one")
    verified = subprocess.run(
        [sys.executable, "-m", "inspector", "verify", str(root), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("bad", ["3/3", "-1/2", "a/b", "2", "1/0"])
def test_a_bad_part_is_refused(demo: Any, tmp_path: Path, bad: str, cli: Any) -> None:
    res = cli("convert", demo(SPEC), tmp_path / "out", "--part", bad)
    assert res.rc == 2 and "--part" in res.stderr and not (tmp_path / "out").exists()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_universal_parts_then_finish_equal_one_run(demo: Any, tmp_path: Path, cli: Any) -> None:
    """Universal splits too: parts write their share of the tensor files into the shared staging folder,
    the finishing run writes the small files and publishes; the folder equals a single run's and verifies."""
    root = demo(SPEC)
    one, out = tmp_path / "one", tmp_path / "out"
    assert cli("convert", root, one, "--format", "universal").rc == 0
    for i in range(3):
        res = cli("convert", root, out, "--format", "universal", "--part", f"{i}/3")
        assert res.rc == 0, res.output
        assert not (out / "global_step3_uni").exists() and (out / "global_step3_uni.partial").is_dir()
    res = cli("convert", root, out, "--format", "universal")
    assert res.rc == 0, res.output
    assert "reused (written by --part runs" in res.output  # the parts' files, not written again
    assert _tree(out) == _tree(one)
    assert cli("verify", root, out).rc == 0


@pytest.mark.parametrize("fsync", [False, True])
def test_universal_parts_are_read_back_before_they_are_published(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    """The finishing run reuses the universal parts' files after reading each back once against its
    journalled CRC-32, with or without --fsync (a file can change after its part finished)."""
    from inspector.convert.kinds import get
    from inspector.convert.kinds.base import Request

    ckpt = scan(str(demo(SPEC)))
    one = get("universal").plan(ckpt, Request(), str(tmp_path / "one"))
    _report(one.run())
    job = get("universal").plan(ckpt, Request(), str(tmp_path / "out"))
    for i in range(2):
        _report(job.run(part=(i, 2), fsync=fsync))
    reads = crc_reads_from_now(monkeypatch)
    _report(job.run(fsync=fsync))
    assert len(reads) == len(job.streamed)  # tensor files and model-states copies
    assert _tree(tmp_path / "out") == _tree(tmp_path / "one")
