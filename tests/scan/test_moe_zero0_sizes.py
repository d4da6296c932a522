"""Which expert-parallel size each MoE layer of a ZeRO-off run used (`scan/moe_zero0_sizes.py`), on records
built here: where shapes fit two sizes only the values decide, and a tie is refused, never guessed. The real
two-size checkpoints (moe_z0_bf16_ep21*) are read bit-exact in test_moe.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from inspector.scan.layouts.moe.zero0_sizes import layer_sizes, local_experts


def _ref(layer: int, expert: int) -> Any:
    return SimpleNamespace(shape=(3,), tag=(layer, expert))


def _layer(layer: int, n: int) -> list[dict[str, Any]]:
    return [{f"moe{layer}.deepspeed_experts.{e}.w": _ref(layer, e)} for e in range(n)]


def _masters(*held: tuple[int, int]) -> list[Any]:
    """A group's unnamed masters: the experts (layer, global expert) it holds, in order."""
    return [SimpleNamespace(master=_ref(*h)) for h in held]


def _true_casts(params: Any, named: Any) -> bool:
    return all(p.master.tag == r.tag for p, (_, r) in zip(params, named, strict=True))


# layer 0 (2 experts) at ep_size 1: 2 local; layer 1 (2 experts) at ep_size 2: 1 local. Layer 0 also fits
# ep_size_2's first master by shape (one local expert at size 2), so only the values tell the two apart.
LAYERS = {0: _layer(0, 2), 1: _layer(1, 2)}
GROUPS = {1: _masters((0, 0), (0, 1)), 2: _masters((1, 0))}


def test_values_decide_where_shapes_fit_two_sizes() -> None:
    assert layer_sizes(LAYERS, [2, 2], GROUPS, _true_casts) == ({0: 1, 1: 2}, "")


def test_a_tie_the_values_cannot_break_is_refused() -> None:
    got, why = layer_sizes(LAYERS, [2, 2], GROUPS, lambda params, named: True)
    assert got is None and "MoE layer 0 (2 experts) continues ep_size_1 and ep_size_2" in why


def test_masters_no_layer_accounts_for_are_refused() -> None:
    groups = {1: _masters((0, 0), (0, 1), (0, 1)), 2: _masters((1, 0))}
    got, why = layer_sizes(LAYERS, [2, 2], groups, _true_casts)
    assert got is None and "ep_size_1 group holds masters no MoE layer accounts for" in why


def test_a_layer_no_group_continues_is_refused() -> None:
    # 3 experts: 3 local at size 1 (the ep_size_1 group holds 2), none at size 2
    got, why = layer_sizes({0: _layer(0, 3)}, [3], GROUPS, _true_casts)
    assert got is None and "continues none" in why


def test_local_experts_are_the_ranks_global_slice() -> None:
    copies = _layer(0, 4)
    assert [n for n, _ in local_experts(copies, 4, 2, 1) or []] == [
        "moe0.deepspeed_experts.2.w",
        "moe0.deepspeed_experts.3.w",
    ]
    assert local_experts(copies, 4, 3, 0) is None and local_experts(copies, 0, 1, 0) is None
