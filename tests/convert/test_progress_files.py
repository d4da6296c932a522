"""The one file count (issue 42 item 7): every progress event counts the files finished of those the job lists
(the count the header says), reused and written-first files included; it never goes back while files are
written side by side, and ends at the listed count."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from inspector.convert.executor import Progress, Report, _Tally, run
from inspector.convert.job import PlannedFile
from inspector.convert.kinds.universal.plan import plan_universal
from inspector.convert.root import PARTIAL
from inspector.scan.scanner import scan
from tests.convert.jobs import universal_job
from tests.convert.kinds.test_universal import SPECS, as_killed


def test_files_written_side_by_side_never_count_back() -> None:
    """Two writers: the file last touched goes from the fourth back to the third, the count of finished ones
    does not (it was "File 4 of 5" then "File 3 of 5")."""
    files = tuple(PlannedFile(f"f{i}", 10) for i in range(5))
    tally = _Tally(0, 0, 5, (0, 5))
    seen = []
    for k, finish in [(0, True), (1, True), (3, False), (2, False), (3, True), (2, True), (4, True)]:
        tally.file = k
        if finish:
            tally.finished += 1
        ev = tally.event(50, files, 1.0, 0)
        seen.append((ev.shard_index, ev.files_done, ev.files_total))
    assert [s[0] for s in seen] == [0, 1, 3, 2, 3, 2, 4]  # the file in hand goes back and forth
    done = [s[1] for s in seen]
    assert done == sorted(done) and done[-1] == 5 and {s[2] for s in seen} == {5}


def _events(job: Any, **kw: Any) -> tuple[list[Progress], Report]:
    events = list(run(job, **kw))
    report = events[-1]
    assert isinstance(report, Report)
    return [e for e in events if isinstance(e, Progress)], report


def test_universal_counts_the_listed_files_and_what_a_resumed_run_reused(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(SPECS["s2"])))
    plan = plan_universal(ckpt, str(tmp_path))
    job = universal_job(plan, workers=2)
    listed = len(job.files)
    assert listed > len(job.streamed)  # the small files are listed too: one count covers them
    progress, report = _events(job)
    assert {p.files_total for p in progress} == {listed}
    done = [p.files_done for p in progress]
    assert done == sorted(done) and done[-1] == listed and report.resumed_shards == 0

    os.rename(plan.out_dir, plan.out_dir + PARTIAL)  # as a killed run leaves it, one tensor file unfinished
    os.remove(os.path.join(plan.out_dir + PARTIAL, plan.files[0].rel))
    as_killed(plan, Path(plan.out_dir + PARTIAL))
    progress, report = _events(universal_job(plan, workers=2), overwrite=True)
    reused = len(job.streamed) - 1
    assert report.resumed_shards == reused
    assert progress[0].files_done >= reused and progress[-1].files_done == listed


def test_the_cli_bar_says_the_same_count() -> None:
    from inspector.cli.live import _where

    ev = Progress(5, 10, "t", "f3", 3, 4, 1.0, 0, files_done=2, files_total=6)
    assert _where(ev, "file") == "files 2/6"


def test_the_app_says_what_a_resumed_run_reused() -> None:
    """A resumed run's result names the files it kept, not only "2.6 GiB written"."""
    from inspector.convert.events import Finished
    from inspector.tui.jobs import done_text

    report = Finished("out", [["a", 1], ["b", 2]], 2, 3, 1.0, resumed_files=1)
    assert "1 file reused from an earlier run" in done_text(report, 0, 0).plain
    assert "reused" not in done_text(Finished("out", [["a", 1]], 1, 1, 1.0), 0, 0).plain


def test_the_app_counts_one_tensor_in_the_singular() -> None:
    from inspector.convert.events import Finished
    from inspector.tui.fmt import plural
    from inspector.tui.jobs import done_text

    assert (plural(1, "tensor"), plural(0, "tensor"), plural(46, "tensor")) == ("1 tensor", "0 tensors", "46 tensors")
    assert plural(24_639, "tensor") == "24,639 tensors"  # as the tables count
    assert ": 1 tensor, " in done_text(Finished("out", [["a", 1]], 1, 1, 1.0), 0, 0).plain
