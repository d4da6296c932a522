"""Universal files of small stage-3 parameters gathered from stripes the workers share
(`universal/shared_rows.py`): the export is byte for byte the one read rank by rank, each stripe is read
once, the stripes kept stay within their bound whatever a run skips, and a rank file cut short is refused
by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.convert.kinds.universal import shared_rows
from inspector.convert.kinds.universal.plan import plan_universal
from inspector.convert.kinds.universal.shared_rows import SharedRows, live
from inspector.convert.stripes import Stripe
from inspector.scan.scanner import scan
from inspector.scan.slices import RankSlices
from tests.convert.jobs import universal as write_universal
from tests.convert.test_stripes import DEEP, assert_cut_short_refused


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("workers", "budget"), [(1, shared_rows.STRIPE_BUDGET), (3, shared_rows.STRIPE_BUDGET), (2, 1 << 16)]
)
def test_the_export_is_the_one_read_rank_by_rank(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, budget: int
) -> None:
    monkeypatch.setattr(shared_rows, "STRIPE_BUDGET", budget)
    ckpt = scan(str(demo(DEEP)))
    loads: list[int] = []
    reads = shared_rows.stripe_reads

    def counted(st: Any) -> Any:
        loads.append(id(st))
        return reads(st)

    plan = plan_universal(ckpt, str(tmp_path / "striped"))
    with monkeypatch.context() as m:
        m.setattr(shared_rows, "stripe_reads", counted)
        write_universal(plan, workers=workers)
    stripes = {id(s) for s in SharedRows(None, plan.files, workers)._of.values()}
    assert len(stripes) > 1 and len(stripes) < len(plan.files) / 4  # runs of files, not one each
    assert sorted(loads) == sorted(set(loads))  # each stripe read once (files go to the workers in order)
    alone = plan_universal(ckpt, str(tmp_path / "alone"))
    with monkeypatch.context() as m:
        m.setattr(SharedRows, "stripe", lambda self, index: None)
        write_universal(alone, workers=workers)
    assert _tree(tmp_path / "striped") == _tree(tmp_path / "alone")


class _Pool:
    """Reads nothing: fills each window with zeros, counting the reads."""

    def __init__(self) -> None:
        self.calls = 0

    def read_runs(self, runs: Any) -> None:
        self.calls += 1
        for _, _, view in runs:
            view[:] = bytes(len(view))


def test_stripes_kept_stay_within_their_bound_whatever_a_run_skips(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_rows, "STRIPE_BUDGET", 1 << 16)  # small stripes: more of them than are kept
    plan = plan_universal(scan(str(demo(DEEP))), str(tmp_path))
    pool = _Pool()
    shared = SharedRows(pool, plan.files, 1)
    firsts: dict[int, int] = {}
    for i in range(len(plan.files)):
        st = shared.stripe(i)
        if st is not None:
            firsts.setdefault(id(st), i)
    assert len(firsts) > live(1)
    for i in firsts.values():  # one file of each stripe, never the others (a resumed or split run)
        assert shared.rows(i).size > 0
        assert len(shared._live) <= live(1)
    assert pool.calls == len(firsts)
    st = shared.stripe(next(iter(firsts.values())))
    assert isinstance(st, Stripe)
    for m in st.tensors:  # every file of a stripe written: its rows go (read again, once, after eviction)
        shared.rows(m.index)
        shared.written(m.index)
    assert id(st) not in shared._live


def test_a_rank_file_cut_short_after_the_scan_is_refused_by_name(demo: Any, tmp_path: Path) -> None:
    plan = plan_universal(scan(str(demo(DEEP))), str(tmp_path / "out"))
    i = next(i for i in range(len(plan.files)) if SharedRows(None, plan.files, 2).stripe(i) is not None)
    slices = plan.files[i].segments
    assert isinstance(slices, RankSlices)
    assert_cut_short_refused(slices, lambda: write_universal(plan))
