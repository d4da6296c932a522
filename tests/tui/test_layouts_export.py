"""The app on every layout fixture (real DeepSpeed 0.19.8 runs): the overview says a model-parallel layout in
the scan's words (a data-parallel one's findings: Ulysses sequence parallelism), and the export form writes,
through the same plan, the bytes `convert` writes (fp32)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.tui.app import make_app
from tests.convert.jobs import execute
from tests.scan.layout_cases import DATA_PARALLEL, MODEL_PARALLEL, ckpt_dir, scan_layout, split_rules
from tests.tui.conftest import exported_fp32, plain, scanned

pytestmark = pytest.mark.slow  # every layout opened, exported and compared in the app: tox -e slow


@pytest.mark.asyncio
@pytest.mark.parametrize("layout", MODEL_PARALLEL)
async def test_the_app_says_the_layout_and_exports_what_convert_writes(layout: str, tmp_path: Path) -> None:
    out = tmp_path / "app"
    app = make_app(
        path=str(ckpt_dir(layout)), out_dir=str(out), tp_split=split_rules(layout), live_meters=False
    )
    async with app.run_test(size=(140, 44)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.parallel is not None and not app.ckpt.errors
        shown = " ".join(plain(w) for w in app.main.query("*"))
        assert app.ckpt.parallel.words.split(" × ")[0] in shown
        assert await exported_fp32(pilot) == "done"
    _same_as_convert(layout, out, tmp_path)


@pytest.mark.asyncio
@pytest.mark.parametrize("layout", sorted(DATA_PARALLEL))
async def test_the_app_opens_a_data_parallel_layout_and_exports_what_convert_writes(
    layout: str, tmp_path: Path
) -> None:
    out = tmp_path / "app"
    app = make_app(path=str(ckpt_dir(layout)), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(140, 44)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.parallel is None and not app.ckpt.errors
        if layout.startswith("sp"):
            shown = " ".join(plain(w) for w in app.query("*"))
            assert "Ulysses sequence parallel" in shown, shown[:2000]
        assert await exported_fp32(pilot) == "done"
    _same_as_convert(layout, out, tmp_path)



def _same_as_convert(layout: str, out: Path, tmp_path: Path) -> None:
    execute(build_plan(scan_layout(layout), ConvertOptions(dtype="fp32")), str(tmp_path / "cli"))
    names = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    assert all(filecmp.cmp(out / n, tmp_path / "cli" / n, shallow=False) for n in names), names
