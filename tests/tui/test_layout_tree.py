"""The app on every model-parallel layout saved by real DeepSpeed (tests/fixtures/layouts): the tensor tree shows
each expert under its global index with the ranks holding it, each pipeline layer with its stage and ranks, and
every tensor's rank marks are global ranks (the ones the overview's layout rows name), not a stage's or a
shard's data-parallel rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets.tree import TreeNode

from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.tui.app import make_app
from inspector.tui.session import ModuleNode
from tests.scan.layout_cases import MODEL_PARALLEL, ckpt_dir
from tests.tui.conftest import plain, scanned

pytestmark = pytest.mark.asyncio

EXPERTS = "moe.deepspeed_moe.experts.deepspeed_experts"


def _rows(tree: TreeNode[object]) -> dict[str, str]:
    """Every module path and tensor name in the tree -> its row as the user reads it (all unfolded)."""
    out: dict[str, str] = {}
    for child in tree.children:
        child.expand()
        if isinstance(child.data, ModuleNode):
            out[child.data.path] = child.label.plain
        elif isinstance(child.data, TensorInfo):
            out[child.data.name] = child.label.plain
        out.update(_rows(child))
    return out


def _listed(text: str) -> set[int]:
    """`0-1,3` or `0-1, 3` -> {0, 1, 3}."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def _marked_ranks(row: str) -> set[int]:
    """The ranks a tensor row marks: `… trainable r0-1,3` -> {0, 1, 3}."""
    last = row.rsplit(" ", 1)[-1]
    return _listed(last[1:]) if last.startswith("r") and last[1:2].isdigit() else set()


def _holder_ranks(row: str) -> set[int]:
    """The ranks a module row names: `4  2 tensors · … · stage 1 · ranks 2-3` -> {2, 3}."""
    return _listed(row.rpartition(" · rank")[2].removeprefix("s").strip())


async def _open(name: str) -> tuple[dict[str, str], str, Checkpoint]:
    app = make_app(path=str(ckpt_dir(name)), live_meters=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None, f"{name}: {app.refused}"
        overview = " ".join(plain(w) for w in app.main.query("*"))
        await pilot.press("t")
        rows = _rows(app.main.tensors_pane.module_tree.root)
        await pilot.pause()
        return rows, overview, app.ckpt


@pytest.mark.parametrize("name", MODEL_PARALLEL)
async def test_every_layout_shows_who_holds_what(name: str) -> None:
    rows, overview, ckpt = await _open(name)
    par = ckpt.parallel
    assert par is not None and par.words in overview
    world = set(range(ckpt.world_size))
    for t in ckpt.tensors:
        assert _marked_ranks(rows[t.name]) <= world, (t.name, rows[t.name])
    if par.kind == "expert" and not par.autoep:  # native MoE: experts are modules under their global index
        experts = [p for p in rows if p.rpartition(".")[0].endswith("deepspeed_experts")]
        assert experts
        for path in experts:
            index = int(path.rpartition(".")[2])
            assert f"expert {index} · rank" in rows[path], rows[path]
    if par.kind == "expert" and par.autoep:  # AutoEP fuses the experts: their module row names the holders
        layer = "model.layers.0.mlp.experts"
        assert "experts 0-1: rank" in rows[layer] and "experts 2-3: rank" in rows[layer], rows[layer]
    # every top-level layer of a pipeline says its stage, and its tensors sit on that stage's ranks
    if par.kind == "pipeline":
        for path in (p for p in rows if p.isdigit()):
            assert "  stage" in rows[path], f"layer {path} shows no stage: {rows[path]}"
            held = _holder_ranks(rows[path])
            for t in ckpt.tensors:
                if t.name.startswith(f"{path}."):
                    assert _marked_ranks(rows[t.name]) <= held, (t.name, rows[t.name], rows[path])
    # a tensor joined from the shards (replicated ones are read from shard 0) names a rank of each shard
    if par.kind == "tensor" and any(f.code == "tp-unrecorded" for f in ckpt.findings):
        assert not ckpt.tensors  # no split recorded (moe_tp_z1_bf16): nothing is joined until --tp-split says it
    elif par.kind == "tensor":
        shards = [_holder_ranks(f" · {who}") for _, who in par.holders]
        # the file holding a rank's masters: its optimizer file, or with ZeRO off its model states
        shard_of = {
            r.optim_file or r.model_file: i for r in ckpt.ranks for i, s in enumerate(shards) if r.rank in s
        }
        joined = [
            t
            for t in ckpt.tensors
            if t.kind is Kind.TRAINABLE and len({shard_of.get(s.file) for s in t.segments}) == len(shards)
        ]
        assert joined
        for t in joined:
            assert all(_marked_ranks(rows[t.name]) & s for s in shards), (t.name, rows[t.name])


@pytest.mark.parametrize(
    ("name", "want"),
    [
        # DeepSpeed's MoE: rank R is expert-parallel rank R mod E; ep_size 2 over 4 ranks, 2 local experts
        # each: experts 0-1 on ranks 0 and 2, experts 2-3 on ranks 1 and 3; the second MoE layer has ep_size 1
        (
            "moe_z2_bf16_ws4",
            {
                f"{EXPERTS}.0": "expert 0 · ranks 0, 2",
                f"{EXPERTS}.3": "expert 3 · ranks 1, 3",
                f"moe2.{EXPERTS[4:]}.1": "expert 1 · ranks 0-3",
            },
        ),
        # the ZeRO-off MoE run writes one optimizer file per expert-parallel rank, but all four ranks hold experts
        (
            "moe_z0_bf16_ws4",
            {f"{EXPERTS}.1": "expert 1 · ranks 0, 2", f"{EXPERTS}.2": "expert 2 · ranks 1, 3"},
        ),
        # PipeDataParallelTopology: stage s is ranks s*dp .. s*dp+dp-1; the tied embedding lives on both stages
        (
            "pp_z1_bf16_dp2",
            {
                "1": "stage 0 · ranks 0-1",
                "4": "stage 1 · ranks 2-3",
                "tied_modules.embed": "stages 0-1 · ranks 0-3",
            },
        ),
        # pipeline x tensor: each stage is two shards (ranks 2s, 2s+1)
        ("pptp_z1_bf16", {"0": "stage 0 · ranks 0-1", "5": "stage 1 · ranks 2-3"}),
    ],
)
async def test_the_tree_names_the_holders(name: str, want: dict[str, str]) -> None:
    rows, _, _ = await _open(name)
    for path, words in want.items():
        assert rows[path].endswith(words), (path, rows[path])


async def test_a_stage_tensor_is_marked_with_its_global_rank() -> None:
    """Stage 1 of a 2-stage x 2-DP pipeline is ranks 2 and 3: its layer-4 weight sits in rank 3's optimizer file
    (`bf16_zero_pp_rank_1_mp_rank_01`, data-parallel rank 1 of stage 1), which the tree once marked `r1`."""
    rows, _, ckpt = await _open("pp_z1_bf16_dp2")
    files = {Path(s.file).name for s in ckpt.tensor("4.weight").segments}
    assert files == {"bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"}
    assert rows["4.weight"].endswith(" r3")


async def test_the_detail_names_a_stage_file_by_its_global_rank() -> None:
    """The detail panel's "where the bytes live" says rank 3 beside stage 1's `pp_rank_1` file (it said rank 1)."""
    app = make_app(path=str(ckpt_dir("pp_z1_bf16_dp2")), live_meters=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        assert app.main.tensors_pane.module_tree.reveal("4.weight")
        await pilot.pause()
        await pilot.pause()
        detail = plain(app.main.tensors_pane.detail)
        assert "rank 3 bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt" in " ".join(detail.split()), detail


async def test_the_detail_of_an_expert_says_who_holds_it() -> None:
    """The cursor on expert 3 of the first MoE layer: the detail panel names its holders too."""
    app = make_app(path=str(ckpt_dir("moe_z2_bf16_ws4")), live_meters=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        assert tree.reveal(f"{EXPERTS}.3")
        await pilot.pause()
        await pilot.pause()
        detail = plain(app.main.tensors_pane.detail)
        assert "held by: expert 3 · ranks 1, 3" in detail, detail
        ranks = sorted({r for t in ckpt_tensors(app, f"{EXPERTS}.3.") for r in tree.ranks_of(t)})
        assert ranks == [3]  # expert-DP rank 1 of EP rank 1: the expert's four tensors lie in its partition
        assert "its tensors' bytes: rank 3 (ZeRO partitions" in detail, detail  # beside "ranks 1, 3" (issue 42)


def ckpt_tensors(app, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.name for t in app.ckpt.tensors if t.name.startswith(prefix)]


@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("moe_z2_bf16_ws4", f"{EXPERTS}.3.0.weight"),  # an expert's master, on expert-DP rank 1 of EP rank 1
        # AutoEP's fused experts, each expert-parallel rank's slice placed at its global experts
        ("autoep_z2_bf16_ws4", "model.layers.0.mlp.experts.w1"),
        ("pp_z1_bf16_dp2", "4.weight"),  # a stage-1 layer
        ("tp_z2_bf16_dp2", "model.layers.0.mlp.down_proj.weight"),  # joined from two shards along dim 1
    ],
)
async def test_statistics_of_a_model_parallel_tensor(name: str, tensor: str) -> None:
    """`s` on a tensor that the layout split (an expert, a stage's layer, a TP shard): its statistics, with the
    16-bit module copy compared against the joined master."""
    from tests.tui.conftest import wait_for

    app = make_app(path=str(ckpt_dir(name)), live_meters=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        pane = app.main.tensors_pane
        assert pane.module_tree.reveal(tensor)
        await pilot.pause()
        await pilot.pause()
        await pilot.press("s")
        await wait_for(pilot, lambda: "module copy vs master" in plain(pane.detail), "statistics")
        text = plain(pane.detail)
        assert tensor in text and "abs max" in text and "module copy vs master" in text, text
