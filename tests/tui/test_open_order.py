"""`zero-inspector open CKPT --source module` exports exactly what `convert --source module` writes: the app
hands its child the order it previewed, so no option is lost on the way (the flattened argv dropped --source)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from inspector.tui.app import make_app
from tests.tui.conftest import converted, launched, scanned


def _files(folder: Path) -> dict[str, bytes]:
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder)) if not n.startswith(".")}


@pytest.mark.asyncio
async def test_open_with_source_module_exports_what_convert_writes(
    small_demo: Path, tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_app = tmp_path / "app"
    app = make_app(launched(monkeypatch, str(small_demo), "--source", "module", "--out", str(by_app)), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        fmt = app.export.format or "model"
        assert await converted(pilot) == "done"
    by_cli, masters = tmp_path / "cli", tmp_path / "masters"
    assert cli("convert", small_demo, by_cli, "--format", fmt, "--source", "module").rc == 0
    assert cli("convert", small_demo, masters, "--format", fmt).rc == 0
    assert _files(by_app) == _files(by_cli)
    assert _files(by_app) != _files(masters)  # the source reached the child (its header says module)


@pytest.mark.parametrize("flag", [["--adapter", "--weights-only"], ["--base", "/no/such/base"]])
def test_open_refuses_what_convert_refuses(small_demo: Path, flag: list[str], cli: Any) -> None:
    res = cli("open", small_demo, *flag)
    assert res.rc != 0 and ("Invalid option" in res.output or "Base model" in res.output)
    assert "Traceback" not in res.output
