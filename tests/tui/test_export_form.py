"""The export form says only what is true (#28 item 8): a rename collision is not "options valid" and blocks
ctrl+s; an invalid shard size leaves no verdict of other options on screen; a refused plan is a failure on the
convert screen, not "Checking that it fits…" with `v Verify` offered."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.export import ExportScreen
from tests.tui.conftest import plain, record_notes, scanned, wait_for

pytestmark = pytest.mark.asyncio

COLLIDE = r"\.weight$=.w; \.bias$=.w"


async def test_rename_collision_blocks_the_form(small_demo: Path, tmp_path: Path) -> None:
    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        assert isinstance(form, ExportScreen)
        form.query_one("#renames", Input).value = COLLIDE
        await wait_for(pilot, lambda: "collision" in plain(form.query_one("#preflight")).lower(), "preflight")
        errors = plain(form.query_one("#form-errors"))
        assert "options valid" not in errors and "✖" in errors and "collision" in errors.lower()
        told = record_notes(app)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form
        assert any(t.title == "Fix the options first" for t in told)


async def test_invalid_shard_size_leaves_no_verdict(small_demo: Path, tmp_path: Path) -> None:
    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        await wait_for(pilot, lambda: "Fits" in plain(form.query_one("#preflight")), "the first verdict")
        form.query_one("#shard", Input).value = "lots"
        await pilot.pause(0.5)
        assert "Fits" not in plain(form.query_one("#preflight"))
        assert "Shard size" in plain(form.query_one("#form-errors"))
        form.query_one("#shard", Input).value = "1GB"
        await wait_for(pilot, lambda: "Fits" in plain(form.query_one("#preflight")), "the verdict again")


async def test_refused_plan_on_the_convert_screen(small_demo: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        app.base_options = replace(app.base_options, renames=((r"\.weight$", ".w"), (r"\.bias$", ".w")))
        await pilot.press("c")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "failed", "refusal"
        )
        screen = app.screen
        assert "Checking that it fits" not in plain(screen.query_one("#convert-title"))
        assert "Not started" in plain(screen.query_one("#convert-title"))
        await pilot.pause()
        assert "verify" not in {b.action for _, b, enabled, _ in screen.active_bindings.values() if enabled}
        assert not screen.check_action("verify", ())


async def test_forced_conversion_says_what_it_left_out(small_demo: Path, tmp_path: Path) -> None:
    """#28 item 12: the damaged-checkpoint question has real line breaks, and the green Done of a forced
    conversion says which tensors are not in the output."""
    from inspector.tui.screens.dialogs import ConfirmDialog
    from tests.cli.test_messages import truncated_copy

    root = truncated_copy(small_demo, tmp_path / "cut")
    app = make_app(path=str(root), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("escape")  # the "Damaged checkpoint" note
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        body = plain(app.screen.query_one("#dialog-body"))
        assert "\\n" not in body and "Converting it would" in body
        await pilot.press("y")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "the conversion"
        )
        result = plain(app.screen.query_one("#result"))
        assert "left out" in result and "cannot be rebuilt" in result and "model.embed_tokens.weight" in result


async def test_quit_names_only_the_running_conversion(small_demo: Path, tmp_path: Path, gate) -> None:  # type: ignore[no-untyped-def]
    """#28 item 9: a finished universal conversion still on the screen stack is not what quitting cancels:
    the question names the running one's words, not the first one's `.partial` folder."""
    from dataclasses import replace

    from inspector.tui.screens.dialogs import ConfirmDialog
    from tests.tui.conftest import choose_universal, start_held

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "first"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await choose_universal(pilot)
        gate.open()
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "the first"
        )
        first = app.screen
        app.export = replace(app.export, out_dir=str(tmp_path / "second"), format="weights")
        gate.path.touch()  # hold the second one
        second = await start_held(pilot, gate)
        assert second is not first and first in app.screen_stack
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        body = plain(app.screen.query_one("#dialog-body"))
        assert "first" not in body and ".partial" not in body, body
        assert second.cancel_words() in body
        await pilot.press("n")
        gate.open()


async def test_question_mark_on_the_new_form_is_help(small_demo: Path, tmp_path: Path) -> None:
    """#28 item 6: the form does not open with the output folder selected, so `?` shows help, not "?"."""
    from inspector.tui.screens.help import HelpScreen

    out = str(tmp_path / "out")
    app = make_app(path=str(small_demo), out_dir=out, live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        assert form.query_one("#out", Input).value == out


async def test_universal_progress_and_result_count_its_files(small_demo: Path, tmp_path: Path) -> None:
    """#28 item 10: a universal export is many files: the progress never says "File 1 of 1" over them and the
    result counts the plan's files, not the one folder the report names."""
    from tests.tui.conftest import choose_universal

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await choose_universal(pilot)
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "the export"
        )
        screen = app.screen
        planned = len(screen.plan.files)
        assert planned > 1
        label = plain(screen.query_one("#shard-label"))
        assert label == f"{planned} of {planned} files written", label  # the header's count (issue 42)
        result = plain(screen.query_one("#result"))
        assert "1 file(s)" not in result and f"{planned} files" in result, result


@pytest.mark.parametrize("name", ["tp_z1_bf16", "moe_z2_bf16_ws4"])
async def test_the_errors_are_on_screen_at_80x24(name: str, tmp_path: Path) -> None:
    """At 80x24 the form scrolls; its ✖ list once sat below the form's end, under the fold, while the preflight
    said "waits for valid options (✖ above)". Every line of it is on screen now, the widget seen there."""
    from tests.scan.layout_cases import ckpt_dir

    app = make_app(path=str(ckpt_dir(name)), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        await wait_for(pilot, lambda: "Fits" in plain(form.query_one("#preflight")), "the first verdict")
        form.query_one("#shard", Input).focus()
        form.query_one("#shard", Input).value = "lots"
        await pilot.pause(0.5)
        box = form.query_one("#form-errors")
        assert "✖ Shard size" in plain(box)
        region = box.region  # where it is drawn (clipped to what its container shows)
        assert region.height >= len(box.render_lines(box.content_region)) >= 1 and region.bottom <= 23
        for y in range(region.y, region.bottom):  # every row of it, above the key bar, is it that is seen there
            assert form.get_widget_at(region.x + 1, y)[0] is box, y
