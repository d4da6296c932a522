"""Pilot tests of every screen and flow on demo checkpoints (real child processes for convert/verify)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from textual.widgets import Input, Select

from inspector.convert.options import ConvertOptions
from inspector.demo.writer import DemoSpec
from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.dialogs import ConfirmDialog, MessageDialog
from inspector.tui.screens.export import ExportScreen
from inspector.tui.screens.help import HelpScreen
from tests.tui.conftest import Gate, plain, saved_last, scanned, start_held, wait_for

pytestmark = pytest.mark.asyncio


async def test_open_shows_overview_and_latest_tag(two_tag_demo: Path) -> None:
    app = make_app(path=str(two_tag_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.tag == "global_step5"
        tags = app.main.query_one("#tags", Select)
        assert tags.value == "global_step5"
        await pilot.press("left_square_bracket")  # previous tag, scanned in the worker
        await wait_for(pilot, lambda: app.ckpt is not None and app.ckpt.tag == "global_step3", "tag switch")
        assert "★ latest" in plain(app.main.query_one("#tag-list"))


async def test_select_submodule_options_convert_verify(small_demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    app = make_app(path=str(small_demo), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "n")  # tensors tab, select none
        assert app.selected == set()
        tree = app.main.tensors_pane.module_tree
        await _focus(pilot, tree, "model.layers.1")
        await pilot.press("space")
        assert app.selected and all(n.startswith("model.layers.1.") for n in app.selected)
        assert app.convert_options().include == ("model.layers.1",)
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        app.screen.query_one("#dtype", Select).value = "fp32"
        await pilot.pause()
        await wait_for(pilot, lambda: "Fits" in plain(app.screen.query_one("#preflight")), "preflight")
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "conversion"
        )
        assert sorted(os.listdir(out)) == ["model.safetensors"]
        await pilot.press("v")
        await wait_for(
            pilot,
            lambda: (
                app.screen.phase in ("verified", "done")
                and app.screen.child is not None
                and not app.screen.child.running
                and app.screen.job == "verify"
            ),
            "verify",
        )
        await wait_for(pilot, lambda: app.screen.phase == "verified", "verified")
        await pilot.press("b")
        assert not isinstance(app.screen, ConvertScreen)


async def _stats_of_largest(pilot):  # type: ignore[no-untyped-def]
    """The Tensors tab, the cursor on the largest tensor, `s` pressed; returns the tensors pane."""
    app = pilot.app
    await pilot.press("t")
    pane = app.main.tensors_pane
    await _focus(pilot, pane.module_tree, max(app.ckpt.tensors, key=lambda t: t.numel).name)
    await pilot.press("s")
    return pane


async def _focus(pilot, tree, name: str) -> None:  # type: ignore[no-untyped-def]
    """The cursor on the tensor or submodule `name`, its parents unfolded (the tree's own `reveal`)."""
    assert tree.reveal(name)
    await pilot.pause()
    await pilot.pause()
    data = tree.cursor_node.data if tree.cursor_node else None
    assert getattr(data, "path", None) == name or getattr(data, "name", None) == name


async def test_cancel_midway_removes_partial_output(small_demo: Path, tmp_path: Path, gate: Gate) -> None:
    out = tmp_path / "out"
    opts = ConvertOptions(shard_size=200_000, dtype="fp32")
    app = make_app(path=str(small_demo), out_dir=str(out), options=opts, live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        screen = await start_held(pilot, gate)
        assert any(n.endswith(".partial") for n in os.listdir(out))
        await pilot.press("escape")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")  # SIGINT: the held reads go, the converter cleans up and exits 130
        await wait_for(pilot, lambda: screen.phase == "cancelled", "cancel")
        assert screen.child is not None and screen.child.proc is not None
        assert screen.child.proc.returncode == 130
        assert not out.exists() or [n for n in os.listdir(out) if n.endswith(".partial")] == []
        assert "Cancelled" in plain(screen.query_one("#result"))
        line = plain(screen.query_one("#overall-text"))  # issue 42: no "Cancelling: …" left above it
        assert line.startswith("Cancelled: ") and "Cancelling" not in line, line
        assert not app.converting


async def asked_and_held(pilot, screen, key: str):  # type: ignore[no-untyped-def]
    """Presses `key` while `screen`'s converter runs: the question says the job is paused, and it is (the
    child stopped until the question is answered). Returns the child's process."""
    import psutil

    proc = psutil.Process(screen.child.pid)
    await pilot.press(key)
    assert isinstance(pilot.app.screen, ConfirmDialog) and "paused" in pilot.app.screen.question
    await wait_for(pilot, lambda: proc.status() == psutil.STATUS_STOPPED, "the converter held")
    return proc


async def test_the_cancel_question_holds_the_job_until_answered(
    small_demo: Path, tmp_path: Path, gate: Gate
) -> None:
    """While "Cancel the conversion?" is open the converter is stopped (it cannot finish behind the dialog);
    "Keep going" lets it run on and finish; the dialog says it is paused."""
    import psutil

    out = tmp_path / "out"
    opts = ConvertOptions(shard_size=200_000, dtype="fp32")
    app = make_app(path=str(small_demo), out_dir=str(out), options=opts, live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        screen = await start_held(pilot, gate)
        proc = await asked_and_held(pilot, screen, "escape")
        gate.open()  # it could run to the end now, but it is held while the question is open
        await pilot.pause(0.5)
        assert proc.status() == psutil.STATUS_STOPPED and screen.phase == "running"
        await pilot.press("n")  # keep going
        await wait_for(pilot, lambda: screen.phase == "done", "the conversion to finish")
        assert "Done" in plain(screen.query_one("#result"))


async def test_the_quit_question_holds_the_job_too(small_demo: Path, tmp_path: Path, gate: Gate) -> None:
    import psutil

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        screen = await start_held(pilot, gate)
        proc = await asked_and_held(pilot, screen, "q")
        await pilot.press("n")
        await wait_for(pilot, lambda: proc.status() != psutil.STATUS_STOPPED, "the converter running again")
        assert screen.phase == "running"


async def test_child_killed_with_sigkill_is_explained(small_demo: Path, tmp_path: Path, gate: Gate) -> None:
    out = tmp_path / "out"
    opts = ConvertOptions(shard_size=200_000)
    app = make_app(path=str(small_demo), out_dir=str(out), options=opts, live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        screen = await start_held(pilot, gate)
        assert any(n.endswith(".partial") for n in os.listdir(out))
        os.kill(screen.child.pid, signal.SIGKILL)  # type: ignore[union-attr, arg-type]
        await wait_for(pilot, lambda: screen.phase == "failed", "the failure report")
        result = plain(screen.query_one("#result"))
        assert "SIGKILL" in result and "OOM killer" in result
        assert ".partial" in result and "reuses the finished shards" in result
        await pilot.press("b")  # the UI stays usable
        assert not isinstance(app.screen, ConvertScreen)
        await pilot.press("o")


async def test_damaged_checkpoint(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = demo.copy(DemoSpec(params=1_000_000, world_size=2), tmp_path / "damaged")
    rank1 = next((root / "global_step3").glob("*zero_pp_rank_1_*optim_states.pt"))
    with open(rank1, "r+b") as fh:
        fh.truncate(os.path.getsize(rank1) // 2)
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        banner = app.main.query_one("#banner")
        assert "-hidden" not in banner.classes
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)  # converting a damaged checkpoint asks first
        await pilot.press("n")
        assert not isinstance(app.screen, ConvertScreen)


async def test_not_a_checkpoint_is_a_dialog(tmp_path: Path) -> None:
    app = make_app(path=str(tmp_path), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog), "the error dialog")
        await pilot.press("escape")
        assert "-hidden" not in app.main.query_one("#banner").classes


async def test_terminal_escapes_in_a_tensor_name_are_a_dialog_not_output(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A crafted checkpoint whose tensor name holds ESC and BEL: refused with a dialog that shows them as
    `\\x1b`; no raw escape ever reaches the screen."""
    from tests.system.test_hostile_files import SPEC, _crafted_names

    root = demo.copy(SPEC, tmp_path / "ckpt")
    _crafted_names(root, "model.x\x1b]0;owned\x07:x:", "0.19.8")
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, MessageDialog) and bool(app.screen.query("#dialog-body")),
            "the error dialog",
        )
        shown = plain(app.screen.query_one("#dialog-body"))
        assert "control characters" in shown and "\\x1b" in shown
        screen = app.export_screenshot()
        assert "\x1b" not in screen and "\x07" not in screen
        assert app.ckpt is None


async def test_folder_with_two_roots(small_demo: Path, two_tag_demo: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(small_demo, run / "_actor")
    os.symlink(two_tag_demo, run / "_critic")
    saved_last(run / "_actor")
    app = make_app(path=str(run), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        roots = app.main.query_one("#roots", Select)
        assert "-hidden" not in roots.classes
        assert app.root == str(run / "_actor")
        roots.value = str(run / "_critic")
        await wait_for(
            pilot, lambda: app.ckpt is not None and app.ckpt.root == str(run / "_critic"), "switch"
        )
        assert app.ckpt.tag == "global_step5"


async def test_crafted_folder_names_never_reach_the_terminal(
    small_demo: Path, two_tag_demo: Path, tmp_path: Path
) -> None:
    """A folder named with OSC/CSI sequences (set the title, clear the screen) beside real roots: the root
    chooser lists only real names, shown as text; no raw escape reaches the screen."""
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(small_demo, run / "_actor")
    os.symlink(two_tag_demo, run / "[bold]critic")
    os.symlink(two_tag_demo, run / "\x1b]2;pwned\x07\x1b[2J")
    app = make_app(path=str(run), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        roots = app.main.query_one("#roots", Select)
        assert app.roots == (str(run / "[bold]critic"), str(run / "_actor"))
        await pilot.press("r")
        await pilot.pause()
        screen = app.export_screenshot()
        assert "\x1b]2" not in screen and "\x07" not in screen
        assert "[bold]critic" in screen  # markup in a folder name is text
        assert roots.expanded


async def test_filter_and_selection_keys(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        everything = {t.name for t in app.ckpt.tensors}
        assert app.selected == everything
        await pilot.press("t", "slash", *"q_proj", "enter")
        tree = app.main.tensors_pane.module_tree
        shown = {t.name for t in tree.shown_tensors()}
        assert shown and all("q_proj" in n for n in shown)
        await pilot.press("n")
        assert app.selected == everything - shown
        await pilot.press("i")
        assert app.selected == everything
        await pilot.press("escape")  # clears the filter
        assert len(tree.shown_tensors()) == len(everything)
        await pilot.press("slash", *"(bad", "enter")
        assert app.main.query_one("#filter", Input).has_class("-bad-pattern")


async def test_statistics_on_demand(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        pane = await _stats_of_largest(pilot)
        await wait_for(pilot, lambda: "histogram" in plain(pane.detail), "statistics")
        text = plain(pane.detail)
        assert "abs max" in text and "histogram" in text and "module copy vs master" in text


async def test_preset_options_and_help_and_quit(small_demo: Path) -> None:
    opts = ConvertOptions(include=("model.layers.0",), dtype="fp32")
    app = make_app(path=str(small_demo), options=opts, live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        assert app.selected and all(n.startswith("model.layers.0.") for n in app.selected)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("e")
        shard = app.screen.query_one("#shard", Input)
        shard.value = "lots"
        await pilot.pause()
        assert "Shard size" in plain(app.screen.query_one("#form-errors"))
        await pilot.press("escape", "q")
    assert app.return_code == 0


async def test_quit_asks_while_converting(small_demo: Path, tmp_path: Path) -> None:
    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "o"), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        app.converting = True
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("n")
        app.converting = False


async def test_command_palette_runs_app_actions(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Export options")
        await wait_for(pilot, lambda: _palette_has(app, "Export options"), "the palette's match")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), "the export screen")


def _palette_has(app, text: str) -> bool:  # type: ignore[no-untyped-def]
    from textual.command import CommandList

    lists = app.screen.query(CommandList)
    return bool(lists) and lists.first().option_count > 0


async def test_convert_asks_when_it_will_not_fit(small_demo: Path, tmp_path: Path) -> None:
    from inspector.tui.frozen import frozen_assess

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "o"), live_meters=False)
    app.frozen_assess = frozen_assess(available=20 * 2**20)  # below any converter's peak
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the does-not-fit question")
        assert "It will not fit" in app.screen.title_text
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConvertScreen | ConfirmDialog), "back")
        assert not app.converting and not (tmp_path / "o").exists()


async def test_unexpected_worker_error_is_a_dialog(small_demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import inspector.scan.scanner

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(inspector.scan.scanner, "scan", boom)
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog), "the error dialog")
        assert "simulated bug" in app.screen.message


async def test_statistics_compare_with_the_previous_tag(two_tag_demo: Path) -> None:
    app = make_app(path=str(two_tag_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        pane = await _stats_of_largest(pilot)
        await wait_for(pilot, lambda: "change since global_step3" in plain(pane.detail), "statistics and diffs")


async def test_key_bar_takes_clicks(small_demo: Path) -> None:
    from inspector.tui.widgets.keybar import KeyBar

    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        bar = app.main.query_one(KeyBar)
        start = plain(bar).index("?  Help")  # where the user sees the key
        await pilot.click(KeyBar, offset=(start, 0))
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help from a click")


async def test_module_detail_follows_its_selection(small_demo: Path) -> None:
    """The focused submodule's "selected: k of n" changes with space, not only when the cursor moves."""
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "n")
        pane = app.main.tensors_pane
        await _focus(pilot, pane.module_tree, "model.layers.1")
        n = sum(1 for t in app.ckpt.tensors if t.name.startswith("model.layers.1."))  # type: ignore[union-attr]
        assert f"selected: 0 of {n}" in plain(pane.detail)
        await pilot.press("space")
        await pilot.pause()
        assert f"selected: {n} of {n}" in plain(pane.detail)


async def test_arrow_keys_fold_and_unfold_submodules(small_demo: Path) -> None:
    """→ opens a folded submodule, then steps into it; ← folds it, then steps out to the parent."""
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        await _focus(pilot, tree, "model.layers")
        node = tree.cursor_node
        assert node is not None and not node.is_expanded
        await pilot.press("right")
        assert node.is_expanded and tree.cursor_node is node
        await pilot.press("right")
        assert tree.cursor_node is node.children[0]
        await pilot.press("left")  # a folded child: step out to its parent
        assert tree.cursor_node is node
        await pilot.press("left")
        assert not node.is_expanded and tree.cursor_node is node


async def test_keys_scroll_the_overview_from_launch_and_never_reach_a_hidden_menu(small_demo: Path) -> None:
    """`down` right after launch focused the tag dropdown (footer "Dismiss menu", keys trapped); at 80x24
    PageDown did nothing until three tabs. The overview has the focus from the start and scrolls."""
    from inspector.tui.screens.overview import OverviewPane

    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("down")
        assert isinstance(app.focused, OverviewPane)
        await scanned(pilot)
        pane = app.main.query_one(OverviewPane)
        assert app.focused is pane and not any(s.expanded for s in app.main.query(Select))
        await pilot.press("pagedown")
        await pilot.pause()
        assert pane.scroll_y > 0
        await pilot.press("t")  # the app's keys still answer
        assert app.main.query_one("#tabs").active == "tensors"
