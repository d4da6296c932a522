"""Which rank wrote which optimizer file. Shapes and sizes agree when one rank's file is copied or renamed
into another's place, so only the files' own evidence tells: stage 1/2 `param_slice_mappings` (each
parameter's fragments must run on consecutive ranks from partition end to partition start), the same bytes
in two ranks' state, and stage 3's zero moment padding on the last rank. Real DeepSpeed runs are checked
the same way in tests/interop (every configuration must scan without a rank-mismatch finding)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector.demo.writer import DemoSpec
from inspector.scan.scanner import scan

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPECS = [
    DemoSpec(stage=1, world_size=3, dtype="bf16", params=30_000),
    DemoSpec(stage=2, world_size=3, dtype="fp16", params=30_000),
    DemoSpec(stage=3, world_size=2, dtype="bf16", params=30_000),
]


def optim_files(root: Path) -> list[Path]:
    tag = next(p for p in root.iterdir() if p.is_dir())
    files = sorted(tag.glob("*optim_states.pt"), key=lambda p: int(p.name.split("_rank_")[1].split("_")[0]))
    return files


def codes(root: Path) -> set[str]:
    return {f.code for f in scan(str(root)).errors}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"s{s.stage}")
def test_untouched_checkpoints_prove_their_ranks(demo: DemoCache, spec: DemoSpec) -> None:
    assert "rank-mismatch" not in codes(demo(spec))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"s{s.stage}")
@pytest.mark.parametrize("how", ["first-over-second", "second-over-first", "swap"])
def test_a_rank_file_in_another_ranks_place_is_an_error(
    demo: DemoCache, tmp_path: Path, spec: DemoSpec, how: str
) -> None:
    root = demo.copy(spec, tmp_path / "ckpt")
    a, b = optim_files(root)[:2]
    if how == "first-over-second":
        shutil.copy(a, b)
    elif how == "second-over-first":
        shutil.copy(b, a)
    else:
        os.rename(a, a.with_suffix(".tmp"))
        os.rename(b, a)
        os.rename(a.with_suffix(".tmp"), b)
    found = scan(str(root)).errors
    assert found, "a rank file in another rank's place went unnoticed"
    assert {f.code for f in found} & {"rank-mismatch", "layout", "mixed-runs"}


def test_convert_refuses_a_copied_rank_file(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(SPECS[1], tmp_path / "ckpt")
    a, b = optim_files(root)[:2]
    shutil.copy(a, b)
    res = cli("convert", root, tmp_path / "out")
    assert res.rc == 1 and "Traceback" not in res.output, res.output
    assert "rank" in res.output and not (tmp_path / "out").exists()


def test_a_middle_rank_copied_over_is_found_without_opening_a_file_again(
    demo: DemoCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 3 has no fragment maps and its padding proof looks at the last rank only: a copy between two
    earlier ranks is told by their equal state, compared from probes taken while each file was open for its
    pickle, and the last rank's padding is read while its file is open for its pickle too (issue 43: the rank
    proof without re-reading), so no rank file is opened twice."""
    from collections import Counter

    from inspector.system.source import Source

    root = demo.copy(DemoSpec(stage=3, world_size=4, dtype="bf16", params=30_000), tmp_path / "ckpt")
    files = optim_files(root)
    opens: Counter[str] = Counter()
    real = Source.open_handle

    def counting(self: Source, path: str | os.PathLike[str]) -> object:
        opens[os.path.basename(os.fspath(path))] += 1
        return real(self, path)

    monkeypatch.setattr(Source, "open_handle", counting)
    assert "rank-mismatch" not in codes(root)
    assert {opens[f.name] for f in files} == {1}, opens
    shutil.copy(files[0], files[1])
    found = [f for f in scan(str(root)).errors if f.code == "rank-mismatch"]
    assert found and "DP ranks 0 and 1" in found[0].message
