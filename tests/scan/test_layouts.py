"""The layouts registry (`scan/layouts/`): every entry keeps the protocol, the first layout that finds or claims
a folder scans it, and a folder no layout claims is refused as not supported yet, saying what was recognised,
never called damaged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.errors import DamagedCheckpointError, UnsupportedCheckpointError
from inspector.scan import scanner
from inspector.scan.layouts import LAYOUTS, Found, Layout, ScanOptions
from inspector.scan.layouts.base import TagLayout
from inspector.scan.model import Checkpoint
from inspector.system.bytesource import ByteSource
from tests.scan.layout_cases import FIXTURES, ckpt_dir


def test_every_layout_keeps_the_protocol_under_its_own_name() -> None:
    assert len(LAYOUTS) >= 6
    assert all(isinstance(layout, Layout) for layout in LAYOUTS)
    names = [layout.name for layout in LAYOUTS]
    assert all(names) and len(set(names)) == len(names)
    assert all(layout.recognises for layout in LAYOUTS)


@pytest.mark.parametrize("layout", sorted(p.parent.name for p in FIXTURES.glob("*/ckpt")))
def test_the_base_is_asked_last_and_never_hides_a_model_parallel_run(layout: str) -> None:
    """Data-parallel ZeRO is the base, asked last: a committed fixture (real DeepSpeed runs) it claims is
    data parallel (no `Parallel`), and every model-parallel one is claimed by a layout before it."""
    found = Found.of(_location(ckpt_dir(layout)))
    first = next(x for x in LAYOUTS if x.claims(found))
    assert LAYOUTS[-1].name == "ZeRO data parallel"
    ckpt = first.scan(found, ScanOptions())
    assert (ckpt.parallel is None) == (first is LAYOUTS[-1]), first.name


def _location(path: Path):  # type: ignore[no-untyped-def]
    from inspector.remote.roots import source_at
    from inspector.scan.locate import locate

    return locate(str(path), None, source_at(str(path), "checkpoint"))


class _Claims(TagLayout):
    """A stand-in layout that claims every tag folder and records what it was given."""

    name = "stand-in"
    recognises = "anything"

    def __init__(self) -> None:
        self.seen: list[Found] = []

    def claims(self, found: Found) -> bool:
        return True

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        self.seen.append(found)
        raise _Scanned


class _Scanned(Exception):
    pass


def test_the_first_layout_that_claims_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _Claims(), _Claims()
    monkeypatch.setattr(scanner, "LAYOUTS", (first, second))
    with pytest.raises(_Scanned):
        scanner.scan(str(ckpt_dir("pp_z1_bf16_dp2")))
    assert len(first.seen) == 1 and not second.seen
    found = first.seen[0]
    assert found.tag and os.path.join(found.root, found.tag) == found.tag_dir
    assert any(n.startswith("layer_") for n in found.names)


class _OwnFolder(_Claims):
    """A tagless layout (as PyTorch DCP is): finds its folder by its own marker file, before the tag walk."""

    def locate(self, path: str, tag: str | None, source: ByteSource) -> Found | None:
        if not os.path.exists(os.path.join(path, ".metadata")):
            return None
        return Found(source, path, "", path, tuple(sorted(os.listdir(path))), how="dcp")

    def claims(self, found: Found) -> bool:
        return False


def test_a_layout_may_find_a_folder_the_tag_walk_cannot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".metadata").write_bytes(b"")
    (tmp_path / "__0_0.distcp").write_bytes(b"")
    own = _OwnFolder()
    monkeypatch.setattr(scanner, "LAYOUTS", (own, *LAYOUTS))
    with pytest.raises(_Scanned):
        scanner.scan(str(tmp_path))
    assert own.seen[0].names == (".metadata", "__0_0.distcp") and own.seen[0].tag == ""
    assert own.seen[0].location.tag_dir == str(tmp_path)


def test_a_folder_no_layout_claims_is_not_supported_yet_not_damaged(tmp_path: Path) -> None:
    """Expert files without their MoE layer (DeepSpeed before 0.6) beside ordinary ZeRO files: every layout
    declines, and the refusal names what was recognised and why, and was not an error about damage."""
    tag = tmp_path / "global_step1"
    tag.mkdir()
    (tmp_path / "latest").write_text("global_step1")
    for name in (
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "expert_0_mp_rank_00_model_states.pt",
        "notes.txt",
    ):
        (tag / name).write_bytes(b"")
    with pytest.raises(UnsupportedCheckpointError) as exc:
        scanner.scan(str(tmp_path))
    assert not isinstance(exc.value, DamagedCheckpointError)
    text = str(exc.value)
    assert "not supported yet" in text
    assert "1 expert file" in text and "1 optimizer-states file" in text and "1 other file" in text
    assert "notes.txt" not in text  # names from the folder are counted, never shown
    assert "native MoE" in text  # the reason a layout gave while declining
    assert "damaged" not in text.lower() and "copy the complete" not in text.lower()
