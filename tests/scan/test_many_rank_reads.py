"""A many-rank save read at a small constant per file (issue 43): each rank file read in a handful of calls
from the pages its archive already holds, the trees of repeated pickles rebuilt by a flat program, another
stage-3 rank's model states parsed without its module, the rank proof's padding read while the last file is
open. None of it may change what the scan finds: the checkpoint equals the one every file unpickled gives,
and a damaged record in any rank file is still refused, naming the file. Compared, never timed."""

from __future__ import annotations

import dataclasses
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.kinds.universal.plan import plan_universal
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.demo.writer import DemoSpec
from inspector.format import rankrepeat, replay, torchzip
from inspector.scan.model import Checkpoint, Kind
from inspector.scan.scanner import scan
from inspector.scan.slices import RankSlices
from tests.convert.jobs import execute
from tests.convert.jobs import universal as write_universal
from tests.convert.test_convert_end_to_end import assert_matches_expected

MANY = DemoSpec(stage=3, world_size=24, dtype="bf16", params=40_000)


pytestmark = pytest.mark.usefixtures("fresh_format_caches")


def records(ckpt: Checkpoint) -> tuple[Any, ...]:
    """What the scan says, segment lists spelled out as tuples (compact records compare as them anyway)."""
    tensors = tuple(
        (t.name, t.shape, t.dtype, t.kind, tuple(t.segments), tuple((m, tuple(s)) for m, s in t.moments))
        for t in ckpt.tensors
    )
    findings = tuple((f.severity, f.code, f.message, f.file) for f in ckpt.findings)
    return tensors, findings, ckpt.world_size, ckpt.stage


def test_rebuilt_trees_give_the_checkpoint_unpickling_every_file_gives(
    demo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = demo(MANY)
    fast = scan(str(root))
    assert len(replay._TEMPLATES) >= 2, "the rank files' pickles must have been rebuilt, not unpickled"
    assert rankrepeat._LAYOUTS, "later ranks' archives must have been taken as repeats"
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    monkeypatch.setattr(torchzip, "learn", lambda *a: None)  # no template: every file unpickled
    slow = scan(str(root))
    assert not replay._TEMPLATES
    assert records(fast) == records(slow)
    assert fast == slow  # every record, groups and ranks included
    assert not fast.errors


def test_a_universal_checkpoint_is_the_one_every_file_unpickled_gives(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The universal kind reads every rank's masters and moments through the records the scan made: its
    files are byte for byte those written from a scan that unpickled every rank file."""
    root = demo(MANY)
    outs = {}
    for name in ("rebuilt", "unpickled"):
        if name == "unpickled":
            replay.forget()
            rankrepeat._LAYOUTS.clear()
            monkeypatch.setattr(torchzip, "learn", lambda *a: None)
        plan = plan_universal(scan(str(root)), str(tmp_path / name))
        write_universal(plan)
        folder = tmp_path / name
        outs[name] = {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".zero-inspector")
        }
    assert outs["rebuilt"] == outs["unpickled"]
    assert any(k.endswith("exp_avg_sq.pt") for k in outs["rebuilt"])


def test_stage3_frozen_parameters_are_one_compact_record_converted_bit_exact(
    demo: Any, tmp_path: Path
) -> None:
    ckpt = scan(str(demo(MANY)))
    ws = ckpt.world_size
    frozen = [t for t in ckpt.tensors if t.kind is Kind.FROZEN]
    assert frozen, "the demo saves frozen parameters"
    model_files = {r.rank: r.model_file for r in ckpt.ranks}
    for t in frozen:
        assert isinstance(t.segments, RankSlices), t.name
        p = -(-t.numel // ws)
        segs = list(t.segments)
        assert [s.numel for s in segs] == [min(p, t.numel - r * p) for r in range(len(segs))]
        assert [s.file for s in segs] == [model_files[r] for r in range(len(segs))]
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16", chunk_elems=1000))
    execute(plan, str(tmp_path / "out"))
    assert_matches_expected(MANY, plan, tmp_path / "out")


def _member(path: Path, suffix: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(path) as z:
        return next(i for i in z.infolist() if i.filename.endswith(suffix))


def _break_header(path: Path, suffix: str) -> None:
    """The local header of one storage record no longer a header (the directory still points at it)."""
    info = _member(path, suffix)
    with path.open("r+b") as fh:
        fh.seek(info.header_offset)
        fh.write(b"\0\0\0\0")


def _overlap(path: Path, suffix: str) -> None:
    """One record's local header says its extra field is long enough to run into the next member."""
    info = _member(path, suffix)
    with path.open("r+b") as fh:
        fh.seek(info.header_offset + 28)
        fh.write(struct.pack("<H", 0xF000))


def _truncate(path: Path, suffix: str) -> None:
    path.write_bytes(path.read_bytes()[:-200])


DAMAGE = {"header": _break_header, "overlap": _overlap, "truncated": _truncate}


@pytest.mark.parametrize("how", sorted(DAMAGE))
@pytest.mark.parametrize("kind", ["model", "optim"])
def test_a_damaged_record_in_a_middle_rank_file_is_still_found(
    demo: Any, tmp_path: Path, how: str, kind: str
) -> None:
    """A middle rank's file is read from a rebuilt tree (its pickle met twice before) and, for model states,
    parsed without its module: the records its pickle asks for are still checked against the file."""
    root = demo.copy(MANY, tmp_path / "ckpt")
    tag = next(p for p in root.iterdir() if p.is_dir())
    name = (
        "zero_pp_rank_11_mp_rank_00_model_states.pt"
        if kind == "model"
        else ("bf16_zero_pp_rank_11_mp_rank_00_optim_states.pt")
    )
    DAMAGE[how](tag / name, "/data/2")
    ckpt = scan(str(root))
    bad = [f for f in ckpt.errors if f.code == "unreadable"]
    assert [f.file for f in bad] == [str(tag / name)], ckpt.errors
    assert "damaged" in bad[0].message or "truncated" in bad[0].message


def test_a_last_rank_file_copied_from_another_rank_is_found_from_the_reads_of_the_scan(
    demo: Any, tmp_path: Path
) -> None:
    """The padding proof reads the last rank's padding while its file is open for its pickle: a file of
    another rank in its place (shapes and sizes alike) is still an error."""
    import shutil

    root = demo.copy(MANY, tmp_path / "ckpt")
    tag = next(p for p in root.iterdir() if p.is_dir())
    last = MANY.world_size - 1
    shutil.copy(
        tag / "bf16_zero_pp_rank_5_mp_rank_00_optim_states.pt",
        tag / f"bf16_zero_pp_rank_{last}_mp_rank_00_optim_states.pt",
    )
    found = [f for f in scan(str(root)).errors if f.code == "rank-mismatch"]
    assert found and found[0].file.endswith(f"rank_{last}_mp_rank_00_optim_states.pt")
    assert "padding" in found[0].message or "same state" in found[0].message


@pytest.mark.parametrize(
    "spec",
    [DemoSpec(stage=s, world_size=4, dtype="bf16", params=400_000) for s in (2, 3)],
    ids=["zero2", "zero3"],
)
def test_no_rank_file_has_a_range_read_twice(
    demo: Any, monkeypatch: pytest.MonkeyPatch, spec: DemoSpec
) -> None:
    """Every read a scan makes of a rank file goes to the file at most once: the archive keeps the pages it
    read (its head, its tail, each record's header page with the start of its record), so the step counters,
    the records beside the directory and the copied-rank probe read after them are served from those. At
    1,024 ranks 3,085 of 9,258 reads were such repeats."""
    from inspector.system.source import LocalHandle

    reads: dict[str, list[tuple[int, int]]] = {}
    again: list[tuple[str, int, int]] = []
    real = LocalHandle.pread

    def counting(self: LocalHandle, n: int, offset: int) -> bytes:
        seen = reads.setdefault(self.path, [])
        if any(at <= offset and offset + n <= at + k for at, k in seen):
            again.append((self.path, n, offset))
        seen.append((offset, n))
        return real(self, n, offset)

    root = demo(spec)
    monkeypatch.setattr(LocalHandle, "pread", counting)
    ckpt = scan(str(root))
    assert not ckpt.errors and len(reads) >= spec.world_size + 1
    assert not again, again[:5]


def test_records_kept_for_other_ranks_hold_no_module(demo: Any) -> None:
    """Another stage-3 rank's model states are parsed without their module (never read: rank 0's names the
    tensors); what the checks compare (config, shapes, steps) is kept."""
    from inspector.scan.layouts.zero.scanner import ZeroScanner

    kept: list[Any] = []
    real = ZeroScanner._check_consistency

    def spy(self: ZeroScanner, model: Any, models: Any, optims: Any) -> None:
        kept.extend(m for r, m in models.items() if r)
        real(self, model, models, optims)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ZeroScanner, "_check_consistency", spy)
        scan(str(demo(MANY)))
    assert len(kept) == MANY.world_size - 1
    assert all(not m.module and m.param_shapes and m.global_steps is not None for m in kept)
    assert len({id(m.ds_config) for m in kept}) <= 2  # shared, not one record per rank


def test_a_frozen_tuple_when_ranks_disagree_on_dtype() -> None:
    """Fragments of mixed dtypes cannot share one per-rank table: they stay plain segments."""
    from inspector.format.views import StorageRef, TensorRef
    from inspector.scan.tensors import _rank_slices

    def frag(i: int, dtype: str) -> TensorRef:
        return TensorRef(StorageRef(f"r{i}.pt", "0", dtype, 64 * i, 16), 0, (4,), (1,), dtype)

    mixed = _rank_slices([frag(0, "bfloat16"), frag(1, "float16")], 7, 4)
    assert isinstance(mixed, tuple) and [s.numel for s in mixed] == [4, 3]
    same = _rank_slices([frag(0, "bfloat16"), frag(1, "bfloat16")], 7, 4)
    assert isinstance(same, RankSlices) and tuple(same) == tuple(
        dataclasses.replace(s, dtype="bfloat16") for s in mixed
    )


def test_a_bad_name_in_another_ranks_module_is_still_refused(demo: Any, tmp_path: Path) -> None:
    """Another stage-3 rank's module is parsed for its names only: those still pass the one name rule."""
    import torch

    root = demo.copy(MANY, tmp_path / "ckpt")
    tag = next(p for p in root.iterdir() if p.is_dir())
    path = tag / "zero_pp_rank_11_mp_rank_00_model_states.pt"
    state = torch.load(path, weights_only=False)
    first = next(iter(state["module"]))
    state["module"] = {("bad\x1b[31mname" if k == first else k): v for k, v in state["module"].items()}
    torch.save(state, path)
    bad = [f for f in scan(str(root)).errors if f.code == "unreadable"]
    assert [f.file for f in bad] == [str(path)]
    assert "\x1b" not in bad[0].message and "control characters" in bad[0].message
