"""The export screen offers DeepSpeed universal checkpoints: preflight, convert in the child, verify."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from inspector.convert.journal import JOURNAL
from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.dialogs import ConfirmDialog
from tests.tui.conftest import Gate, choose_universal, plain, scanned, start_held, wait_for


@pytest.mark.asyncio
async def test_export_universal_convert_and_verify(small_demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    app = make_app(path=str(small_demo), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        text = await choose_universal(pilot)
        assert "Fits" in text and str(out / "global_step3_uni") in text
        assert "The whole checkpoint" in plain(app.screen.query_one("#selection-summary"))
        shown = re.search(r"Output\s+([\d.]+) MiB\s+(\d+) files?, (\d+) tensors", text)
        assert shown is not None, text
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "conversion"
        )
        assert sorted(os.listdir(out)) == ["global_step3_uni", "latest_universal"]
        assert (out / "latest_universal").read_text().strip() == "global_step3_uni"
        assert "Done" in plain(app.screen.query_one("#result"))
        # the prediction on the form, against what was written (not against the core's own estimate)
        written = [p for p in (out / "global_step3_uni").rglob("*") if p.is_file()]
        states = [p for p in written if p.parent.parent.name == "zero" and p.stem in ("fp32", "exp_avg", "exp_avg_sq")]
        assert (int(shown[2]), int(shown[3])) == (len(written), len(states))
        on_disk = sum(p.stat().st_size for p in written) / 2**20
        assert abs(float(shown[1]) - on_disk) <= 0.02 * on_disk, (shown[1], on_disk)
        await pilot.press("v")
        await wait_for(pilot, lambda: app.screen.phase == "verified", "verified")
        assert "Verified" in plain(app.screen.query_one("#overall-text"))


def test_a_cancelled_universal_conversion_says_it_resumes(tmp_path: Path) -> None:
    from inspector.tui.jobs import explain_exit

    part = tmp_path / "global_step3_uni.partial" / "zero" / "w"
    part.mkdir(parents=True)
    (part / "fp32.pt").write_bytes(b"x" * 3000)
    title, message, hint = explain_exit(130, True, None, "", 0, str(tmp_path), resumable=True)
    assert title == "Cancelled" and "kept" in message
    assert "1 unfinished *.partial file, 2.9 KiB" in hint and "resumes" in hint
    _, message, _ = explain_exit(130, True, None, "", 0, str(tmp_path))
    assert "removed its partial output" in message  # safetensors: as before


def test_what_is_left_never_counts_a_neighbours_write_probe(tmp_path: Path) -> None:
    """A part of a Slurm array starting beside a failed run makes and removes a probe folder in OUT: what the
    app says is left is the run's own files, as the convert path sees them (`outnames.entries`)."""
    from inspector.convert.outnames import PROBE
    from inspector.tui.jobs import left_on_disk

    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x")
    (tmp_path / f"{PROBE}1234").mkdir()
    said = left_on_disk(str(tmp_path))
    assert "holds 1 file;" in said or said.endswith("holds 1 file."), said
    assert "does not exist" in left_on_disk(str(tmp_path / "absent"))


@pytest.mark.asyncio
async def test_cancelled_universal_conversion_resumes_from_the_ui(
    small_demo: Path, tmp_path: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel a universal conversion held mid-run: the UI says the finished files are kept and converting
    again resumes; `c` again finishes it, reusing those files, and the output verifies."""
    out = tmp_path / "out"
    uni, staging = out / "global_step3_uni", out / "global_step3_uni.partial"
    monkeypatch.setenv("ZI_GATE_JOURNAL", str(out / JOURNAL))  # held once a file is finished and journalled
    app = make_app(path=str(small_demo), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await choose_universal(pilot)
        screen = await start_held(pilot, gate, key="ctrl+s")
        await pilot.press("escape")
        assert isinstance(app.screen, ConfirmDialog)
        assert "kept" in plain(
            app.screen.query_one("#dialog-body")
        )  # not "the partial output will be removed"
        await pilot.press("y")  # SIGINT: the writer stops, keeping the files it finished
        await wait_for(pilot, lambda: screen.phase == "cancelled", "cancel")
        assert screen.child.proc is not None and screen.child.proc.returncode == 130
        result = plain(screen.query_one("#result"))
        assert "Cancelled" in result and "kept in the *.partial folder" in result
        assert "1 unfinished *.partial file" in result and "resumes" in result
        assert not app.converting and not uni.exists() and staging.is_dir()
        lines = (out / JOURNAL).read_text().splitlines()[1:]  # the first names the job
        journalled = [json.loads(x)["file"].split("/", 1)[1] for x in lines if x]
        kept = {  # the files finished (journalled with their CRC-32), by inode: a resume leaves them in place
            rel: os.stat(staging / rel).st_ino for rel in journalled
        }
        assert kept, sorted(os.walk(staging))

        gate.open()
        await pilot.press("b")  # back to the checkpoint (not the export form it was started from)
        assert app.screen is app.main
        await pilot.press("c")  # the same conversion again ("c on the main screen tries again"): it resumes
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, ConvertScreen)
                and app.screen is not screen
                and app.screen.phase == "done"
            ),
            "the resumed conversion",
        )
        assert sorted(os.listdir(out)) == ["global_step3_uni", "latest_universal"]
        assert (out / "latest_universal").read_text().strip() == "global_step3_uni"
        for rel, ino in kept.items():
            assert os.stat(uni / rel).st_ino == ino, rel
        await pilot.press("v")
        await wait_for(pilot, lambda: app.screen.phase == "verified", "verified")
        assert "Verified" in plain(app.screen.query_one("#overall-text"))
