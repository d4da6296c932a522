"""A rank file's record parsed once per pickle (`parse/reparse.py`): the ranks a template rebuilds take the
first one's record in their own tensors and name. The scan is the one that parses every file, on the
demo's saves and on real DeepSpeed saves of four ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.demo.writer import DemoSpec
from inspector.format.views import TensorRef
from inspector.parse import reparse
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.scanner import scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"
REAL = sorted(p.name for p in FIXTURES.glob("*_ws4"))

pytestmark = pytest.mark.usefixtures("fresh_format_caches")


def _applied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    files: list[str] = []
    apply = reparse._Plan.apply

    def counting(self: Any, made: list[TensorRef], file: str) -> Any:
        files.append(file)
        return apply(self, made, file)

    monkeypatch.setattr(reparse._Plan, "apply", counting)
    return files


def _parsing_every_file(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(reparse, "rebuilt", lambda tree: None)
        return scan(str(root))


@pytest.mark.parametrize("stage", [2, 3])
def test_a_demo_save_scans_as_when_every_file_is_parsed(
    demo: Any, monkeypatch: pytest.MonkeyPatch, stage: int
) -> None:
    root = demo(DemoSpec(stage=stage, world_size=8, dtype="bf16", params=60_000))
    applied = _applied(monkeypatch)
    fast = scan(str(root))
    if stage == 3:  # a stage-2 rank's pickle has its own slice mappings: no two ranks write the same
        assert len(set(applied)) >= 8, applied  # both kinds of file, from the third of a pickle on
    assert fast == _parsing_every_file(root, monkeypatch) and not fast.errors


@pytest.mark.parametrize("name", REAL)
def test_a_real_save_scans_as_when_every_file_is_parsed(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = FIXTURES / name / "ckpt"
    fast = scan(str(root))
    assert fast == _parsing_every_file(root, monkeypatch)


def test_each_rank_keeps_its_own_tensors_and_name(demo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records read into later ranks hold those ranks' files' tensors and names, never the first one's."""
    root = demo(DemoSpec(stage=3, world_size=8, dtype="bf16", params=60_000))
    records: list[OptimStates] = []
    real = OptimStates.parse.__func__  # type: ignore[attr-defined]

    def keeping(cls: type[OptimStates], tree: Any, file: str, stage3: bool) -> OptimStates:
        records.append(real(cls, tree, file, stage3))
        return records[-1]

    monkeypatch.setattr(OptimStates, "parse", classmethod(keeping))
    applied = _applied(monkeypatch)
    assert not scan(str(root)).errors
    assert any("optim_states" in f for f in applied), applied
    assert len({r.file for r in records}) == len(records) == 8
    for r in records:
        refs = [g.master for g in r.groups] + [t for g in r.groups for t in (g.moments or {}).values()]
        assert refs and all(t.path == r.file for t in refs), r.file


def test_a_record_holding_an_object_it_cannot_copy_is_parsed_every_time() -> None:
    """A record with a value of a kind it does not know is not kept: each tree is parsed."""

    class Odd:
        pass

    with pytest.raises(reparse._Unknown):
        reparse._Plan((Odd(),), [], "f")


def test_a_refusal_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse that refuses leaves nothing kept: the next tree of that program is parsed again."""
    program, calls = object(), []
    monkeypatch.setattr(reparse, "rebuilt", lambda tree: (program, []))

    def refusing() -> ModelStates:
        calls.append(1)
        raise ValueError("refused")

    for _ in range(2):
        with pytest.raises(ValueError):
            reparse.parsed({}, "f", ("model", False), refusing)
    assert len(calls) == 2 and not reparse._PLANS
