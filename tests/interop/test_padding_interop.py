"""Padding figures against the rank files DeepSpeed wrote: the overview's contents row, the ranks table and
`scan` count `group_paddings` (end of each group) plus `param_alignment_paddings` (between parameters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from inspector.scan.scanner import scan
from inspector.scan.summary import alignment_padding, contents_rows, rank_row

pytestmark = pytest.mark.interop


@pytest.mark.configs("s2_round_robin", "s2_align_round_robin")
def test_padding_agrees_with_the_rank_files(config: str, ds_checkpoint: Callable[[str], Any]) -> None:
    ckpt = scan(str(ds_checkpoint(config).root))
    end = align = 0
    for i, r in enumerate(ckpt.ranks):
        assert r.optim_file is not None
        osd = torch.load(r.optim_file, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        end += sum(int(p) for p in osd["group_paddings"])
        if i == 0:  # the same list on every rank: one entry per parameter, for the whole group
            align += sum(int(p) for g in osd.get("param_alignment_paddings") or [] for p in g)
    if config == "s2_align_round_robin":
        assert align > 0  # the case this test is for: padding between parameters
    found = alignment_padding(ckpt)
    assert sum(found.values()) == align
    rows = [rank_row(r, found) for r in ckpt.ranks]
    assert sum(row.padding for row in rows) == end + align
    pad = [x for x in contents_rows(ckpt) if x.key == "padding"]
    assert (pad[0].numel if pad else 0) == end + align
