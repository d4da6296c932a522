"""`tie`: a frozen DCP tensor is made the TIED alias of a trainable one only when their bytes are equal;
one too big to compare at scan is named in a finding and kept as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.scan.layouts.dcp import tied
from inspector.scan.model import Kind, Segment, TensorInfo
from inspector.system.source import Source


def _tensor(path: Path, name: str, kind: Kind, offset: int) -> TensorInfo:
    return TensorInfo(name, (2, 3), "float32", kind, (Segment(str(path), offset, 6, "float32"),))


def _case(tmp_path: Path) -> tuple[Source, list[TensorInfo]]:
    a, b = bytes(range(24)), bytes(range(1, 25))
    f = tmp_path / "__0_0.distcp"
    f.write_bytes(a + a + b)
    ts = [
        _tensor(f, "emb.weight", Kind.TRAINABLE, 0),
        _tensor(f, "head.weight", Kind.FROZEN, 24),  # the same bytes
        _tensor(f, "other.weight", Kind.FROZEN, 48),  # same shape, other bytes
    ]
    return Source.at(str(tmp_path)), ts


def test_equal_bytes_make_an_alias_and_others_stay_frozen(tmp_path: Path) -> None:
    src, ts = _case(tmp_path)
    out, findings = tied.tie(src, ts, str(tmp_path))
    kinds = {t.name: (t.kind, t.alias_of) for t in out}
    assert kinds == {
        "emb.weight": (Kind.TRAINABLE, None),
        "head.weight": (Kind.TIED, "emb.weight"),
        "other.weight": (Kind.FROZEN, None),
    }
    assert out[1].segments == ts[0].segments and findings == []


def test_a_tensor_too_big_to_compare_is_named_not_tied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tied, "COMPARE_LIMIT", 8)
    src, ts = _case(tmp_path)
    out, findings = tied.tie(src, ts, str(tmp_path))
    assert [t.kind for t in out] == [Kind.TRAINABLE, Kind.FROZEN, Kind.FROZEN]
    assert [f.code for f in findings] == ["dcp-tied-unchecked"] * 2
    assert "probably tied" in findings[0].message
