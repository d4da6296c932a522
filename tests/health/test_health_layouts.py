"""`health` on every model-parallel layout fixture (real DeepSpeed 0.19.8 runs): a NaN planted as a diverged
step leaves it (in the fp32 master and the 16-bit module copy the optimizer copies it into; the last element,
so in the last rank's partition) in one expert (native MoE: under its global index), one AutoEP expert bank,
one pipeline layer on the last stage (the finding names that stage), one tensor-parallel joined weight, is
reported on that tensor and nowhere else; the untouched fixture has no NaN anywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from inspector.cli.main import main
from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.scan.scanner import scan
from tests.health.planting import plant
from tests.scan.layout_cases import LAYOUTS, TP_SPLIT, ckpt_dir, scan_layout, split_args, writable

EXPERT = re.compile(r"deepspeed_experts\.(\d+)\.")
LAYER = re.compile(r"^(\d+)\.")


def _victim(ckpt: Checkpoint) -> TensorInfo:
    """The tensor a layout spreads furthest: the highest-numbered native expert, an AutoEP bank, the last
    pipeline layer, a row-split tensor-parallel weight."""
    trainable = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE and t.alias_of is None]
    by_rank = [
        (int(m.group(1)), t.name, t) for t in trainable if (m := EXPERT.search(t.name) or LAYER.match(t.name))
    ]
    if ckpt.parallel is not None and ckpt.parallel.tp > 1:  # a split layer: joined from several shards' files
        by_rank = [x for x in by_rank if len({s.file for s in x[2].segments}) > 1] or by_rank
    if by_rank:
        return max(by_rank, key=lambda x: (x[0], x[1]))[2]
    picks = [t for t in trainable if ".experts." in t.name] or [t for t in trainable if "o_proj" in t.name]
    shards = [t for t in trainable if len({tuple(re.findall(r"mp_rank_\d+", s.file)) for s in t.segments}) > 1]
    picks = picks or shards  # a split weight: joined from several tensor-parallel shards' files
    assert picks, [t.name for t in trainable]
    return picks[0]


def _health(root: Path, capsys: pytest.CaptureFixture[str], layout: str = "") -> tuple[int, dict[str, Any]]:
    rc = main(["health", str(root), "--json", *split_args(layout)])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_nan_in_one_part_is_reported_there_and_nowhere_else(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, clean = _health(ckpt_dir(layout), capsys, layout)
    assert not [t for t in clean["tensors"] if t["nan"]]
    root = writable(layout, tmp_path / "ckpt")
    victim = _victim(scan_layout(layout, root))
    for segments in (victim.segments, victim.module_copy):
        if segments:
            plant(segments, [victim.numel - 1], [float("nan")])
    if layout in TP_SPLIT:  # every parameter replicated: a NaN in shard 0's copy alone is a damaged replica
        damaged = scan_layout(layout, root)
        assert [(f.code, victim.name in f.message) for f in damaged.errors] == [("tp-mismatch", True)]
        assert main(["health", str(root), *split_args(layout)]) != 0
        return
    rc, report = _health(root, capsys, layout)
    assert rc != 0
    sources = ["master", *(["module"] if victim.module_copy else [])]
    assert [(t["name"], t["source"], t["nan"]) for t in report["tensors"] if t["nan"]] == [
        (victim.name, s, 1) for s in sources
    ]
    nan = [f for f in report["findings"] if f["severity"] == "error"]
    assert nan and {f["tensor"] for f in nan} == {victim.name}, nan
    ckpt = scan_layout(layout)
    if ckpt.parallel is not None and ckpt.parallel.kind == "pipeline":  # the last layer: the last stage's
        assert f"{victim.name} (pipeline stage {ckpt.parallel.pp - 1}): " in nan[0]["message"], nan
    if m := EXPERT.search(victim.name):  # native MoE: the global expert index, past the first rank's experts
        assert int(m.group(1)) >= 1 and victim.name in nan[0]["message"]


def test_a_nan_the_module_copy_lacks_leaves_a_zero_off_master_unnamed_and_health_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ZeRO off names masters by proving each the cast of a module copy: a NaN in the master alone (a damaged
    file, not a diverged step) breaks the proof, the scan names no tensor, and health says that (before, it
    blamed --include/--exclude patterns nobody gave)."""
    root = writable("moe_z0_bf16", tmp_path / "ckpt")
    victim = _victim(scan(str(root)))
    plant(victim.segments, [victim.numel - 1], [float("nan")])
    rc = main(["health", str(root)])
    err = capsys.readouterr().err
    assert rc == 2 and "named no tensor" in err and "--include" not in err and "→" in err, err
