"""A scan opens each rank file a bounded number of times, whatever the tensors in it: its load, the copies'
checks (`parallel_checks.CopyChecks`, one reader a scan phase) and a step counter. A check that opened the
file again for every tensor (a tensor-parallel scan opened each optimizer file 5 times; a ZeRO-off fp32 one,
its optimizer file once a parameter) costs round trips per tensor from a bucket or a parallel file system."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import inspector.system.source as source
from inspector.scan.scanner import scan

LAYOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"
CKPTS = sorted(p for p in LAYOUTS.glob("*/ckpt") if p.is_dir())


@pytest.mark.parametrize("root", CKPTS, ids=[p.parent.name for p in CKPTS])
def test_no_file_is_opened_once_a_tensor(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: Counter[str] = Counter()
    real = source.Source.open_handle

    def counting(self: source.Source, path: str) -> source.LocalHandle:
        opened[str(path)] += 1
        return real(self, path)

    monkeypatch.setattr(source.Source, "open_handle", counting)
    ckpt = scan(str(root))
    assert opened
    most = max(opened.values())
    assert most <= 4, (opened.most_common(1), len(ckpt.tensors))


def test_copy_checks_keep_at_most_their_bound_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks' reader keeps at most `_OPEN` files open, closing the least recently read first, and none
    after its scan phase; the verdicts are the same as with room for all."""
    from inspector.scan import parallel_checks

    root = LAYOUTS / "tp_z3_bf16_dp3" / "ckpt"
    roomy = scan(str(root))
    held: list[int] = []
    paths: set[str] = set()
    live: list[parallel_checks.CopyChecks] = []
    real_handle, real_init = parallel_checks.CopyChecks._handle, parallel_checks.CopyChecks.__init__

    def init(self: parallel_checks.CopyChecks, src: object) -> None:
        real_init(self, src)  # type: ignore[arg-type]
        live.append(self)

    def handle(self: parallel_checks.CopyChecks, path: str) -> object:
        h = real_handle(self, path)
        held.append(len(self._handles))
        paths.add(path)
        return h

    monkeypatch.setattr(parallel_checks, "_OPEN", 1)
    monkeypatch.setattr(parallel_checks.CopyChecks, "__init__", init)
    monkeypatch.setattr(parallel_checks.CopyChecks, "_handle", handle)
    tight = scan(str(root))
    assert len(paths) > 1 and max(held) <= 1 and live  # more files than room: some were closed and reopened and all(not c._handles for c in live)
    assert tight.tensors == roomy.tensors and tight.findings == roomy.findings
