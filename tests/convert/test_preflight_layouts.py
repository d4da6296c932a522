"""`preflight` on every model-parallel layout fixture (real DeepSpeed 0.19.8 runs): a RAM and disk figure for
each, weights and universal where the layout offers one, and the real conversion, run in a child, stays within
the predicted peak RSS and writes the predicted bytes (exactly for safetensors; the universal figure is an
estimate of pickled files)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from inspector.cli.main import main
from tests.child_rss import run_cli
from tests.scan.layout_cases import LAYOUTS, NO_UNIVERSAL, NO_UNIVERSAL_WHY, ckpt_dir, split_args

# a real conversion in a child for every layout and kind (92 runs, ~30-50 s on 2 cores): tox -e slow
pytestmark = pytest.mark.slow


def _written(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["weights", "universal"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_real_run_stays_within_the_preflight(
    layout: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = [str(ckpt_dir(layout)), "--format", kind, *split_args(layout)]
    rc = main(["preflight", *args, "--out", str(out), "--json"])
    said = capsys.readouterr()
    if (
        kind == "universal" and layout in NO_UNIVERSAL
    ):  # refused before anything is predicted, with the reason
        assert rc == 2 and re.search(NO_UNIVERSAL_WHY, said.err) and "→" in said.err, said.err
        return
    assert rc == 0, said.err
    est = json.loads(said.out)
    assert est["fits"] and est["output_kind"] == kind
    assert est["predicted_peak_rss_bytes"] > 0 and est["free_disk_bytes"] > est["output_bytes"] > 0
    peak, _ = run_cli(["convert", *args[:1], str(out), *args[1:]])
    assert peak <= est["predicted_peak_rss_bytes"], (peak, est["predicted_peak_rss_bytes"])
    if kind == "weights":
        assert _written(out) == est["output_bytes"]
    else:
        assert abs(_written(out) - est["output_bytes"]) <= 0.05 * est["output_bytes"]
