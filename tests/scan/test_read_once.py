"""A scan loads each rank file once: what a layout reads beyond the base scan's records comes from the trees
the base scan loads, and a tree a claim loaded is kept for the scan (`Found.trees`). Counted on the real
fixtures (tests/fixtures/layouts) by wrapping the one loader every read goes through (`torchzip.load`)."""

from __future__ import annotations

from collections import Counter

import pytest

from inspector.format import torchzip
from tests.scan.layout_cases import LAYOUTS, scan_layout


@pytest.mark.parametrize("case", LAYOUTS)  # every layout fixture: a new layout cannot load twice unseen
def test_every_rank_file_is_loaded_once(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """AutoEP's and native MoE's records (`ds_autoep_layers`, `ds_zero_partition_groups`, `num_experts`) come
    from the trees the scan loads anyway; the rank-0 model states a claim looked into (AutoEP's, the pipeline +
    MoE refusal's) are not loaded again by the scan that follows (`Found.trees`), nor a tensor-parallel
    shard's by the check that the shards record one split, nor a pipeline stage's or a ZeRO-off shard's model
    states by the layout's own read after the claim looked into them."""
    loads: Counter[str] = Counter()
    real = torchzip.load

    def counting(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        loads[str(path)] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(torchzip, "load", counting)
    ckpt = scan_layout(case)  # with its --tp-split where it records none
    assert not ckpt.errors and loads, "the probe must see the scan's loads"
    assert max(loads.values()) == 1, {p.rsplit("/", 1)[-1]: n for p, n in loads.items() if n > 1}
