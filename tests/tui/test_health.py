"""The Health tab: `h` runs the same pass as `zero-inspector health` in the background, the table fills in,
sorts, and enter opens the tensor; a NaN planted in a master comes first; escape cancels mid-read."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from inspector.convert.reader import FilePool
from inspector.demo.writer import DemoSpec
from inspector.health import run_check
from inspector.scan.scanner import scan
from inspector.tui.app import make_app
from inspector.tui.screens.health import HealthPane
from inspector.tui.widgets.health_view import layer_chart, layer_rows
from inspector.tui.widgets.tensor_detail import TensorDetail
from tests.conftest import DemoCache
from tests.health.helpers import plant
from tests.tui.conftest import plain, scanned, wait_for

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=2_000_000)  # four layers: siblings to compare
NAME = "model.layers.2.mlp.down_proj.weight"


class Gate(threading.Event):
    """Set: reads go on. Clear: every read after the first four waits (the pass is surely unfinished)."""

    reads = 0


@pytest.fixture
def held_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    gate = Gate()
    real = FilePool.read_into

    def held(self: FilePool, *args: object) -> object:
        gate.reads += 1
        while gate.reads > 4 and not gate.is_set():
            gate.wait(0.01)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(FilePool, "read_into", held)
    yield gate
    gate.set()


def _done(pane: HealthPane) -> bool:
    return pane.report is not None and not pane.running


async def reading(pilot: Pilot[object], gate: Gate) -> HealthPane:
    """After the scan, `h`, and the pass held mid-read by `gate`: the Health pane."""
    await scanned(pilot)
    await pilot.press("h")
    await wait_for(pilot, lambda: gate.reads > 4, "the pass to start reading")
    return pilot.app.main.health_pane  # type: ignore[attr-defined,no-any-return]


async def checked(pilot: Pilot[object]) -> HealthPane:
    """After the scan, `h`, and the pass to its end: the Health pane."""
    await scanned(pilot)
    await pilot.press("h")
    pane: HealthPane = pilot.app.main.health_pane  # type: ignore[attr-defined]
    await wait_for(pilot, lambda: _done(pane), "the health pass")
    return pane


@pytest.mark.asyncio
async def test_h_runs_the_pass_and_the_table_matches_the_cli(demo: DemoCache) -> None:
    root = demo(SPEC)
    truth = run_check(scan(str(root)))
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        pane = app.main.health_pane
        assert pane.report is None and not pane.table.entries  # nothing read before it is asked for
        await pilot.press("h")
        assert app.main.query_one("#tabs").active == "health"
        await wait_for(pilot, lambda: _done(pane), "the health pass")
        table = pane.table
        assert app.focused is table
        got = {(e.row.name, e.row.source): e.row.stats for e in table.entries}
        assert got == {(r.name, r.source): r.stats for r in truth.rows}
        assert table.row_count == len(truth.rows)
        assert "sound" in plain(pane.query_one("#health-status")) or truth.findings

        # `s` cycles the order: by norm, largest first, NaN last
        while table.order_by != "norm":
            await pilot.press("s")
        norms = [e.row.stats.norm for e in table.entries]
        assert norms == sorted(norms, key=lambda v: -v if not math.isnan(v) else math.inf)
        # the highlighted row's numbers are spelled out under the table
        await pilot.press("down")
        shown = table.entry_at_cursor()
        assert shown is not None and shown.row.name in plain(pane.query_one("#health-row"))

        # enter: the tensor in the tree, its detail beside it
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()
        assert app.main.query_one("#tabs").active == "tensors"
        detail = app.main.tensors_pane.query_one(TensorDetail)
        assert detail.tensor is not None and detail.tensor.name == shown.row.name

        # back on the tab, `h` shows the finished result instead of reading again
        entries = list(table.entries)
        await pilot.press("h")
        assert not pane.running and table.entries == entries


@pytest.mark.asyncio
async def test_a_nan_in_a_master_comes_first_and_is_an_error(demo: DemoCache, tmp_path: Path) -> None:
    root = demo.copy(SPEC, tmp_path / "ck")
    plant(scan(str(root)).tensor(NAME).segments, [3], [float("nan")])
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        pane = await checked(pilot)
        first = pane.table.entries[0]
        assert (first.row.name, first.row.source, first.row.stats.nan) == (NAME, "master", 1)
        assert "1 error" in plain(pane.query_one("#health-status"))
        findings = plain(pane.query_one("#health-findings"))
        assert findings.lstrip().startswith("✖ error") and NAME in findings


@pytest.mark.asyncio
async def test_escape_cancels_a_pass_that_is_still_reading(demo: DemoCache, held_reads: Gate) -> None:
    """Reads after the first few wait on a gate: the pass is surely unfinished when escape is pressed; the keys
    answer meanwhile, and the cancelled pass says how far it got."""
    gate = held_reads
    app = make_app(path=str(demo(SPEC)), live_meters=False)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            pane = await reading(pilot, gate)
            assert pane.running
            await pilot.press("o")  # the keys work while it reads
            assert app.main.query_one("#tabs").active == "overview"
            await pilot.press("h")  # back; still the same run
            assert pane.running
            await pilot.press("escape")
            gate.set()  # held reads go on and see the cancel at their next chunk
            await wait_for(pilot, lambda: not pane.running, "the cancel")
            assert pane.report is None
            assert "Cancelled" in plain(pane.query_one("#health-status"))
    finally:
        gate.set()


@pytest.mark.asyncio
async def test_comparison_with_another_tag_draws_the_change(two_tag_demo: Path) -> None:
    """Two tags: the default comparison is the other tag; each master row carries its change and the chart
    draws one bar per layer for norm and for change."""
    app = make_app(path=str(two_tag_demo), live_meters=False)
    async with app.run_test(size=(160, 48)) as pilot:
        pane = await checked(pilot)
        assert pane.report is not None and pane.report.against == "global_step3"
        masters = [e.row for e in pane.table.entries if e.row.source == "master"]
        assert masters and all(r.delta_norm is not None for r in masters)
        layers = layer_rows(pane.report.modules)
        assert layers and all(m.module.rpartition(".")[2].isdigit() for m in layers)
        chart = plain(pane.query_one("#health-chart"))
        assert "change since global_step3" in chart
        assert sum(1 for line in chart.splitlines() if "layers." in line) == len(layers)


def test_chart_marks_a_layer_with_nan_and_scales_to_the_largest() -> None:
    from inspector.health.report import ModuleRollup

    def layer(i: int, norm: float, nan: int = 0) -> ModuleRollup:
        return ModuleRollup(f"model.layers.{i}", "master", 3, False, 4, 100, nan, 0, 0, 1.0, norm, None)

    text = layer_chart([layer(0, 1.0), layer(1, 4.0), layer(2, math.nan, nan=7)], 60, None).plain
    lines = text.splitlines()[1:]
    assert lines[1].count("█") > 3 * lines[0].count("█") > 0  # bars in proportion
    assert "7 NaN/Inf" in lines[2] and "nan" in lines[2]


def test_layer_rows_take_only_the_outermost_numbered_blocks() -> None:
    from inspector.health.report import ModuleRollup

    def m(name: str) -> ModuleRollup:
        return ModuleRollup(name, "master", name.count(".") + 1, True, 1, 1, 0, 0, 0, 1.0, 1.0, None)

    rows = layer_rows(
        [m("model.layers.10"), m("model.layers.2"), m("model.layers.2.experts.1"), m("model.norm")]
    )
    assert [r.module for r in rows] == ["model.layers.2", "model.layers.10"]


def test_two_moe_layers_experts_are_told_apart_in_the_chart() -> None:
    """Two MoE layers' experts are blocks with the same last two parts (`deepspeed_experts.0`): each bar's label
    says which layer it is (the moe_z2_bf16_ws4 fixture's names)."""
    from inspector.health.report import ModuleRollup

    def m(name: str) -> ModuleRollup:
        return ModuleRollup(name, "master", name.count(".") + 1, True, 1, 1, 0, 0, 0, 1.0, 1.0, None)

    names = [f"{layer}.deepspeed_moe.experts.deepspeed_experts.{e}" for layer in ("moe", "moe2") for e in (0, 1)]
    labels = [line.split()[0] for line in layer_chart([m(n) for n in names], 80, None).plain.splitlines()[1:]]
    assert labels == [
        "moe…deepspeed_experts.0",
        "moe…deepspeed_experts.1",
        "moe2…deepspeed_experts.0",
        "moe2…deepspeed_experts.1",
    ]


def test_long_names_keep_their_layer_numbers_when_narrow() -> None:
    from inspector.tui.widgets.health_view import _elide

    name = "model.layers.12.self_attn.o_proj.weight"
    assert _elide(name, 60) == name
    assert _elide(name, 30) == "m.l.12.self_attn.o_proj.weight"
    short = _elide(name, 22)
    assert short == "m.l.12.s.o_proj.weight" and len(short) <= 22
    assert len(_elide(name, 10)) == 10 and _elide(name, 10).startswith("…")


@pytest.mark.asyncio
async def test_another_tag_stops_the_pass_and_clears_the_table(two_tag_demo: Path, held_reads: Gate) -> None:
    gate = held_reads
    app = make_app(path=str(two_tag_demo), live_meters=False)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            pane = await reading(pilot, gate)
            await pilot.press("left_square_bracket")  # the older tag
            await wait_for(
                pilot, lambda: app.ckpt is not None and app.ckpt.tag == "global_step3", "the older tag"
            )
            gate.set()
            await pilot.pause(0.3)
            assert not pane.running and pane.report is None and not pane.table.entries
            assert "h: check every tensor of global_step3" in plain(pane.query_one("#health-status"))
    finally:
        gate.set()


@pytest.mark.asyncio
async def test_a_file_that_went_bad_is_a_dialog_not_a_crash(demo: DemoCache, tmp_path: Path) -> None:
    """A rank file truncated after the scan: the pass stops with the reader's error in a dialog."""
    from inspector.tui.screens.dialogs import MessageDialog

    root = demo.copy(SPEC, tmp_path / "ck")
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        for f in sorted(root.rglob("*optim_states.pt")):
            with open(f, "r+b") as fh:
                fh.truncate(f.stat().st_size // 2)
        await pilot.press("h")
        pane = app.main.health_pane
        await wait_for(pilot, lambda: not pane.running, "the pass to end")
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog), "the error dialog")
        assert pane.report is None
        assert "Stopped" in plain(pane.query_one("#health-status"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
@pytest.mark.asyncio
async def test_the_pass_reads_at_a_lower_cpu_priority_than_the_ui(demo: DemoCache, held_reads: Gate) -> None:
    """The reader threads run niced, so on a busy machine the UI thread gets the cores first."""
    from inspector.tui.screens.health_pass import NICE

    def nice(tid: int) -> int:
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[16])  # field 19, counted after the command name

    app = make_app(path=str(demo(SPEC)), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        pane = await reading(pilot, held_reads)
        readers = [t.native_id for t in threading.enumerate() if t.name.startswith("zi-health")]
        assert readers and all(nice(tid) == NICE for tid in readers if tid is not None)
        assert nice(threading.get_native_id()) == 0  # the UI's own thread
        assert pane.running
        held_reads.set()  # the app waits for its workers as it closes
        await wait_for(pilot, lambda: not pane.running, "the pass to end")
