"""Issue 42's last part: named selections proposed from the layout (`p`: per pipeline stage, expert, TP split
group) beside the user's own, which last between runs in the XDG state file; a hostile state file is a notice,
never a crash; exporting one writes the bytes `convert --selection NAME` writes; snapshots of the picker."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, OptionList, Select

from inspector.convert import selection_store as store
from inspector.tui.app import make_app
from inspector.tui.screens.dialogs import NameDialog
from inspector.tui.screens.export import ExportScreen
from inspector.tui.screens.picker import SelectionPicker
from tests.scan.layout_cases import ckpt_dir, scan_layout
from tests.tui.conftest import exported_fp32, fixed_copy, launched, record_notes, scanned, wait_for
from tests.tui.test_snapshots import SIZES, _app, _scanned, _settled


def _proposed(layout: str, name: str) -> set[str]:
    from inspector.convert.selections import proposed

    return set(next(s for s in proposed(scan_layout(layout)) if s.name == name).tensors)


async def _pick(pilot: Pilot[object], name: str) -> None:
    """`p`, the cursor moved to `name` with the arrow keys as a user would, enter."""
    app = pilot.app
    await pilot.press("p")
    await wait_for(pilot, lambda: isinstance(app.screen, SelectionPicker), "the picker")
    screen = app.screen
    assert isinstance(screen, SelectionPicker)
    names = [s.name for s in screen.listed]
    for _ in range(names.index(name)):
        await pilot.press("down")
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, SelectionPicker), "the picker closed")


@pytest.mark.asyncio
@pytest.mark.parametrize(("layout", "name"), [("pp_z1_bf16", "stage 1"), ("moe_z2_bf16", "expert 3"),
                                              ("tp_z1_bf16", "TP split on dim 1")])  # fmt: skip
async def test_p_lists_the_layouts_selections_and_enter_selects_one(layout: str, name: str) -> None:
    app = make_app(path=str(ckpt_dir(layout)), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        everything = set(app.selected)
        await _pick(pilot, name)
        assert app.selected == _proposed(layout, name) != everything
        assert app.main.tensors_pane.module_tree.selected == app.selected
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), "the form")
        assert app.screen.query_one("#named", Select).value == name  # the form names what is in force


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_picked_stage_exports_the_bytes_convert_selection_writes(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "app"
    app = make_app(path=str(ckpt_dir("pptp_z1_bf16")), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await _pick(pilot, "stage 1")
        assert await exported_fp32(pilot) == "done"
    r = cli("convert", ckpt_dir("pptp_z1_bf16"), tmp_path / "cli", "--selection", "stage 1", "--dtype", "fp32")
    assert r.rc == 0, r.stderr
    names = sorted(os.listdir(tmp_path / "cli"))
    assert names == sorted(os.listdir(out)) and "model.safetensors" in names
    assert all(filecmp.cmp(out / n, tmp_path / "cli" / n, shallow=False) for n in names), names


@pytest.mark.asyncio
async def test_the_export_form_offers_the_proposed_ones_too() -> None:
    app = make_app(path=str(ckpt_dir("moe_z2_bf16")), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), "the form")
        app.screen.query_one("#named", Select).value = "expert 2"
        want = _proposed("moe_z2_bf16", "expert 2")
        await wait_for(pilot, lambda: app.selected == want, "expert 2 in force")


@pytest.mark.asyncio
async def test_a_saved_selection_lasts_to_the_next_run_and_d_removes_it(small_demo: Path) -> None:
    first = make_app(path=str(small_demo), live_meters=False)
    async with first.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "slash", *"layers.1.", "enter")
        await pilot.pause()
        wanted = set(first.selected) & set(first.shown_only or ())
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(first.screen, NameDialog), "the name dialog")
        first.screen.query_one(Input).value = "layer 1"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(first.screen, NameDialog), "saved")
        await first.workers.wait_for_complete()  # the state file is written by a worker
    assert os.path.isfile(os.path.join(store.state_folder(), store.FILE))

    again = make_app(path=str(small_demo), live_meters=False)  # the next run: read from the state file
    async with again.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await _pick(pilot, "layer 1")
        assert again.selected == wanted
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(again.screen, SelectionPicker), "the picker")
        picker = again.screen
        assert isinstance(picker, SelectionPicker)
        picker.query_one(OptionList).highlighted = [s.name for s in picker.listed].index("layer 1")
        await pilot.press("d")
        await wait_for(pilot, lambda: "layer 1" not in [s.name for s in picker.listed], "removed")
        await again.workers.wait_for_complete()  # the state file is written by a worker
    assert "layer 1" not in store.of_root(store.load(), str(small_demo))


@pytest.mark.asyncio
async def test_a_hostile_state_file_is_a_notice_and_is_replaced_on_save(small_demo: Path) -> None:
    folder = Path(store.state_folder())
    folder.mkdir(parents=True)
    (folder / store.FILE).write_bytes(b'{"version": 1, "roots": {"/x": {"\x1b]2;pwned\x07": 3}}}')
    app = make_app(path=str(small_demo), live_meters=False)
    told = record_notes(app)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await wait_for(pilot, lambda: any(t.title == "Saved selections ignored" for t in told), "the notice")
        said = " ".join(t.message for t in told)
        assert "pwned" not in said and "\x1b" not in said and store.FILE in said
        assert [s.proposed for s in app.named.listed(app.ckpt)] == [True, True]  # the demo's kinds; no saved
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, NameDialog), "the name dialog")
        app.screen.query_one(Input).value = "everything"
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(t.title == "Selection saved" for t in told), "saved")
    assert list(store.of_root(store.load(), str(small_demo))) == ["everything"]


@pytest.mark.asyncio
async def test_open_selection_presets_a_proposed_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """...from the app's one scan: neither `open` nor the preset scans the checkpoint again."""
    import inspector.scan.scanner

    calls: list[object] = []
    real = inspector.scan.scanner.scan
    monkeypatch.setattr(inspector.scan.scanner, "scan", lambda *a, **k: calls.append(a) or real(*a, **k))
    launch = launched(monkeypatch, str(ckpt_dir("pp_z1_bf16")), "--selection", "stage 0")
    assert launch.selection == "stage 0" and not calls
    app = make_app(launch, live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        assert len(calls) == 1, calls
        assert app.selected == _proposed("pp_z1_bf16", "stage 0")


@pytest.fixture(scope="session")
def snapshot_pptp() -> Path:
    """The pipeline x tensor-parallel fixture at a fixed path (the header shows it)."""
    return fixed_copy(ckpt_dir("pptp_z1_bf16"), "zero-inspector-snapshot-pptp")


@SIZES
def test_picker(snap_compare, snapshot_pptp: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """Stages and TP split groups from the layout, and one saved by the user below them."""

    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, SelectionPicker), "the picker")
        await _settled(pilot)

    store.save(str(snapshot_pptp), "my heads", "global_step3", frozenset({"5.weight", "5.bias"}))  # as `m` did
    assert snap_compare(_app(snapshot_pptp), terminal_size=size, run_before=run)
