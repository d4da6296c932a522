"""Padding figures against the rank files DeepSpeed wrote: the overview's contents row, the ranks table and
`scan` count `group_paddings` (end of each group) plus `param_alignment_paddings` (between parameters)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from inspector.scan.scanner import scan
from inspector.scan.summary import alignment_padding, contents_rows, rank_row

pytestmark = pytest.mark.interop


# torch.load of the rank files unpickles DeepSpeed's classes: done in a subprocess (no deepspeed in this one).
# `param_alignment_paddings` is the same list on every rank (one entry per parameter of the whole group).
_READ = """
import json, sys, torch
end = align = 0
for i, path in enumerate(sys.argv[1:]):
    osd = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    end += sum(int(p) for p in osd["group_paddings"])
    if i == 0:
        align += sum(int(p) for g in osd.get("param_alignment_paddings") or [] for p in g)
print(json.dumps([end, align]))
"""


@pytest.mark.configs("s2_round_robin", "s2_align_round_robin")
def test_padding_agrees_with_the_rank_files(config: str, ds_checkpoint: Callable[[str], Any]) -> None:
    ckpt = scan(str(ds_checkpoint(config).root))
    files = [r.optim_file for r in ckpt.ranks]
    end, align = json.loads(
        subprocess.run(
            [sys.executable, "-c", _READ, *files], check=True, capture_output=True, text=True
        ).stdout.splitlines()[-1]  # the last line: importing deepspeed may log an accelerator warning first
    )
    if config == "s2_align_round_robin":
        assert align > 0  # the case this test is for: padding between parameters
    found = alignment_padding(ckpt)
    assert sum(found.values()) == align
    rows = [rank_row(r) for r in ckpt.ranks]
    assert sum(row.padding for row in rows) == end + align
    pad = [x for x in contents_rows(ckpt) if x.key == "padding"]
    assert (pad[0].numel if pad else 0) == end + align
