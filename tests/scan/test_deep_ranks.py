"""A deep model's stage-3 rank files (a record per parameter in each, ~1,100 for a 405B model) scan alike
whether their directories and storages are read record by record, in bulk (`format/zipdir.py`), or taken
from an earlier rank's archive they repeat (`format/rankrepeat.py`), and the demo writes such a model
(`--layers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.demo.spec import DemoSpec, architecture
from inspector.demo.writer import write_demo
from inspector.format import rankrepeat, replay, zipdir
from inspector.scan.scanner import scan


def test_demo_layers_set_the_parameter_count_per_file() -> None:
    params, _ = architecture(DemoSpec(params=2_000_000, layers=40))
    assert sum(p.name.startswith("model.layers.") for p in params) == 40 * 10
    assert architecture(DemoSpec(params=2_000_000))[0] != params  # the default: by size


def test_a_deep_stage3_checkpoint_scans_alike_in_bulk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "deep"
    write_demo(str(root), DemoSpec(stage=3, world_size=4, params=2_000_000, layers=40))
    seen: list[object] = []
    real = zipdir.read
    monkeypatch.setattr(zipdir, "read", lambda *a: seen.append(real(*a)) or seen[-1])

    def scanned(bulk: bool, repeats: bool = False) -> tuple[object, ...]:
        monkeypatch.setattr(zipdir, "BULK_RECORDS", 256 if bulk else 1 << 30)
        monkeypatch.setattr(zipdir, "AFTER", 0)
        monkeypatch.setattr(rankrepeat, "_MAX_LAYOUTS", 8 if repeats else 0)  # 0: nothing is learnt
        replay.forget()
        rankrepeat._LAYOUTS.clear()
        c = scan(str(root))
        return c.tensors, c.findings, c.files, c.stage, c.world_size

    loop = scanned(False)
    assert not seen
    bulk = scanned(True)
    assert len(seen) >= 4 and all(s is not None for s in seen)  # every model file's directory in bulk
    assert bulk == loop
    taken: list[object] = []
    adopt = rankrepeat.adopt
    monkeypatch.setattr(rankrepeat, "adopt", lambda *a: taken.append(adopt(*a)) or taken[-1])
    assert scanned(True, repeats=True) == loop
    assert any(taken), "later ranks' archives must have been taken as repeats"
    assert len(loop[0]) > 360 and not [f for f in loop[1] if f.severity.name == "ERROR"]
