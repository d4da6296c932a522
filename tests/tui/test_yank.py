"""`y` (#28 item 18): the command shown is the app's export, byte for byte, when a shell runs it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Input, Select

from inspector.tui.app import make_app
from inspector.tui.child import REPO_ROOT
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.dialogs import CopyDialog
from inspector.tui.screens.export import ExportScreen
from tests.tui.conftest import plain, scanned, wait_for

pytestmark = pytest.mark.asyncio


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


async def test_the_copied_command_writes_what_the_app_writes(small_demo: Path, tmp_path: Path) -> None:
    app_out, cli_out = tmp_path / "app out", tmp_path / "cli out"  # a space: the line must quote it
    app = make_app(path=str(small_demo), out_dir=str(app_out), live_meters=False)
    copied: list[str] = []
    async with app.run_test(size=(120, 36)) as pilot:
        app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
        await scanned(pilot)
        await pilot.press("t", "n")  # one submodule and one more tensor
        tree = app.main.tensors_pane.module_tree
        names = sorted(t.name for t in app.ckpt.tensors)
        layer = next(n for n in names if ".layers.1." in n).rsplit(".", 2)[0]
        tree.set_selection({n for n in names if n.startswith(layer + ".")} | {names[0]})
        await pilot.press("e")
        form = app.screen
        assert isinstance(form, ExportScreen)
        form.query_one("#dtype", Select).value = "fp32"
        form.query_one("#shard", Input).value = "300KB"
        form.query_one("#renames", Input).value = r"^model\.=base."
        await wait_for(pilot, lambda: "Fits" in plain(form.query_one("#preflight")), "preflight")
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, CopyDialog), "the command")
        line = app.screen.command
        assert copied == [line] and line.startswith("zero-inspector convert ")
        assert plain(app.screen.query_one("#dialog-body")).strip() == line
        await pilot.press("escape")
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "the export"
        )
    argv = shlex.split(line)
    assert argv[3] == str(app_out)
    argv[3] = str(cli_out)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    run = subprocess.run([sys.executable, "-m", "inspector", *argv[1:]], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    ours, theirs = _files(app_out), _files(cli_out)
    assert len(ours) > 1 and ours == theirs  # several shards, every byte the same


async def test_y_names_the_tensor_under_the_cursor(small_demo: Path, tmp_path: Path) -> None:
    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "o"), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        app.copy_to_clipboard = lambda text: None  # type: ignore[method-assign]
        await scanned(pilot)
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        name = app.ckpt.tensors[0].name
        tree.reveal(name)
        await pilot.pause()
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, CopyDialog), "the dialog")
        assert app.screen.name_text == name
        assert name in plain(app.screen.query_one("#copy-name"))


@pytest.mark.parametrize(
    "name",
    ["ck\x1b#\ntouch PWNED\n", os.fsdecode(b"ck\xff\xfe")],
    ids=["esc-hash-newline", "undecodable-bytes"],
)
async def test_y_on_a_crafted_folder_name_copies_a_line_that_pastes_as_the_name(
    small_demo: Path, tmp_path: Path, name: str
) -> None:
    """#38 C.1: readline obeys a pasted ESC-# and runs a line at each raw newline; an undecodable byte killed
    the app in OSC 52's UTF-8 encoding. The real clipboard path runs here (the headless driver encodes it)."""
    import shutil

    folder = tmp_path / name
    shutil.copytree(small_demo, folder)
    app = make_app(path=str(folder), out_dir=str(tmp_path / "o"), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await scanned(pilot)
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, CopyDialog), "the command")
        line = app.clipboard
        assert line == app.screen.command and line.isascii() and line.isprintable(), ascii(line)
        await pilot.press("n")  # the tensor-name copy goes through the same exit
        await pilot.pause()
        assert app.is_running
    run = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line.removeprefix('zero-inspector ')}"], capture_output=True
    )
    argv = run.stdout.split(b"\0")[:-1]
    assert argv[0] == b"convert" and argv[1] == os.fsencode(str(folder)), argv
    assert not (Path.cwd() / "PWNED").exists()
