"""MoE under ZeRO-3 through DeepSpeed's AutoEP (`expert_parallel` in the config, DeepSpeed 0.19.8).

What such a tag folder holds (read off real DeepSpeed 0.19.8 saves, tests/fixtures/layouts/make_autoep.py):
the ordinary stage-3 files, one `zero_pp_rank_R_mp_rank_00_model_states.pt` and one
`*_zero_pp_rank_R_mp_rank_00_optim_states.pt` per rank, and no expert files. AutoEP fuses each MoE layer's
experts into one 3-D tensor per weight (`<layer>.experts.w1` `[n_local, ...]`) on each expert-parallel rank,
and the optimizer holds two kinds of sub-groups, told apart by `ds_zero_partition_groups[g]`:

* `replicated` (the dense weights): partitioned over all ranks exactly as any stage-3 group (§3.4);
* `autoep_expert` (group `ep_size_E`): partitioned only over its expert-data-parallel group
  (`partition_ranks`, this rank's place `partition_rank`), with the LOCAL shard shapes in `param_shapes`.

Each rank's model states carry `ds_autoep_layers`: per layer its module path, expert placement (which global
experts each expert-parallel rank holds), affine maps (per parameter: the logical `[num_experts, ...]` shape
and, per expert-parallel rank, dense pieces `source` offset in the logical tensor ← `dest` offset in the
shard), the rank's own `ep_rank`, and the `zero3_partitioned` format with its version (1). The router is
registered twice (`<layer>.router` and the alias `<layer>.gate`): the alias is a tied name.

The reader rebuilds each expert-data-parallel group's local shard with the stage-3 arithmetic, then places
its pieces into the logical tensor: every expert weight comes out whole, under DeepSpeed's name, experts in
global order along the first dimension, as byte ranges like every other layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from inspector.errors import InspectorError, UnsupportedCheckpointError
from inspector.parse.autoep import AutoEPLayer, PartitionGroup, autoep_layers, partition_groups
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.claims import Role, expert_role
from inspector.scan.files import RankFiles
from inspector.scan.layout import Layout, ParamShapes, stage3_layout
from inspector.scan.layouts.autoep.place import holding, place
from inspector.scan.layouts.autoep.zero12 import zero12_layout
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.zero.scanner import Read, ZeroScanner
from inspector.scan.locate import Location
from inspector.scan.metadata import stage3_rank_proof
from inspector.scan.model import Checkpoint, Finding, GroupInfo, Parallel, RankGroup, Severity

T = TypeVar("T")


def is_autoep(loc: Location, files: RankFiles, trees: dict[str, Any]) -> bool:
    """Whether the rank-0 model states record AutoEP layers (metadata only). The tree is left in `trees`
    (`Found.trees`): the scan that follows takes it instead of loading the file again."""
    path = files.zero3_model.get(0) or files.model
    if path is None or not files.optim:
        return False
    try:
        return bool(autoep_layers(tree_at(trees, path, loc.source), path))
    except InspectorError:
        return True  # the AutoEP scan reports what is wrong with it


def scan_autoep(loc: Location, files: RankFiles, trees: dict[str, Any]) -> Checkpoint:
    scanner = _AutoEPScanner(loc, files, trees)
    ckpt = scanner.build()
    return replace(ckpt, parallel=scanner.parallel, findings=tuple(scanner.findings))


@dataclass
class _Rank:
    """What one rank's files say about AutoEP."""

    layers: tuple[AutoEPLayer, ...]
    groups: tuple[PartitionGroup, ...]


class _AutoEPScanner(ZeroScanner):
    parallel: Parallel | None = None
    words = "this AutoEP checkpoint"

    def __init__(self, loc: Location, files: RankFiles, trees: dict[str, Any]) -> None:
        super().__init__(loc, files, trees)
        # AutoEP's own records of each file, parsed from the tree the base scan loaded (or why they could not
        # be): `ds_autoep_layers` per model-states file, `ds_zero_partition_groups` per optimizer file
        self._layers: dict[str, tuple[AutoEPLayer, ...] | InspectorError] = {}
        self._groups: dict[str, tuple[PartitionGroup, ...] | InspectorError | None] = {}

    def _model_states(self, tree: Any, path: str, module: bool = True) -> ModelStates:
        model = super()._model_states(tree, path, module)
        try:
            self._layers[path] = autoep_layers(tree, path) or ()
        except InspectorError as exc:  # raised where the records are used (`_model`, `_rank`)
            self._layers[path] = exc
        return model

    def _optim_states(self, tree: Any, path: str, stage3: bool) -> OptimStates:
        states = super()._optim_states(tree, path, stage3)
        try:
            self._groups[path] = partition_groups(tree, path)
        except InspectorError as exc:
            self._groups[path] = exc
        return states

    def _expert_role(self, model: ModelStates, stage3: bool) -> Role | None:
        """ZeRO-1/2 saves write each expert's 16-bit weights to its own file, for the layers and expert counts
        `ds_autoep_layers` records; ZeRO-3 saves write none."""
        if stage3:
            return None
        return expert_role({la.layer_id: la.num_experts for la in self.layers}, 1, "ds_autoep_layers")

    def _model(self, stage3: bool) -> ModelStates:
        model = super()._model(stage3)
        self.layers = _recorded(self._layers, model.file) or ()
        return replace(model, shared_params={**model.shared_params, **_router_aliases(model, self.layers)})

    def _stage3_proof(self, param_shapes: ParamShapes, states: list[OptimStates]) -> list[Finding]:
        """The padding proof knows only groups partitioned over every rank: the expert groups are left out."""
        dense = tuple(() if g in self.expert_groups else s for g, s in enumerate(param_shapes))
        return stage3_rank_proof(dense, states, self.loc.source, self._padding)

    def _proof_shapes(self, param_shapes: ParamShapes, last: OptimStates) -> ParamShapes:
        """The expert groups as the last rank's own `ds_zero_partition_groups` names them, left out while
        its file is open; where the layout's reading of every rank differs, the proof reads again."""
        groups = self._groups.get(last.file)
        if not isinstance(groups, tuple):
            return param_shapes
        experts = {g for g, pg in enumerate(groups) if set(pg.families) == {"autoep_expert"}}
        return tuple(() if g in experts else s for g, s in enumerate(param_shapes))

    expert_groups: frozenset[int] = frozenset()
    layers: tuple[AutoEPLayer, ...] = ()

    def _layout(self, read: Read) -> Layout | None:
        param_shapes, states = read.param_shapes, read.states()
        if not read.complete or not param_shapes:
            return super()._layout(read)
        try:
            if read.stage3:
                ranks = [self._rank(r, read.models, read.optims) for r in range(read.ws)]
                lay = self._build(param_shapes, states, ranks)
            elif read.model.ds_config.data_before_expert_parallelism:
                raise UnsupportedCheckpointError(
                    "This AutoEP run set use_data_before_expert_parallelism: its ZeRO-1/2 files do not say "
                    "which ranks held which experts, and the usual rank rule does not apply.",
                    hint="This grouping is not read yet; only DeepSpeed's default (rank R is expert-parallel "
                    "rank R mod E) is.",
                )
            else:
                lay, self.parallel = zero12_layout(
                    param_shapes, states, self.layers, self.files, self.loc.source
                )
        except InspectorError as exc:
            self.add(Severity.ERROR, "layout", exc.message, self.loc.tag_dir, exc.hint)
            return None
        self.findings += lay.findings
        return lay

    def _rank(
        self, r: int, models: Mapping[int, ModelStates | None], optims: Mapping[int, OptimStates | None]
    ) -> _Rank:
        m, o = models[r], optims[r]
        assert m is not None and o is not None
        layers, groups = _recorded(self._layers, m.file), _recorded(self._groups, o.file)
        if not layers or groups is None:
            raise UnsupportedCheckpointError(
                f"Rank {r}'s files lack the AutoEP records (ds_autoep_layers, ds_zero_partition_groups) that "
                "rank 0's have.",
                hint="Files from different runs are mixed, or the checkpoint predates DeepSpeed 0.19.8.",
            )
        return _Rank(layers, groups)

    def _build(
        self, param_shapes: ParamShapes, states: Sequence[OptimStates], ranks: Sequence[_Rank]
    ) -> Layout:
        """Each sub-group rebuilt per partition group; expert tensors then placed by their affine maps."""
        ws = len(states)
        lay = Layout()
        groups: list[GroupInfo] = []
        rank_groups: list[list[RankGroup]] = [[] for _ in range(ws)]
        experts: set[int] = set()
        maps = {p.name: p for layer in ranks[0].layers for p in layer.params}
        for r, rank in enumerate(ranks):
            if [_shared(x) for x in rank.layers] != [_shared(x) for x in ranks[0].layers]:
                raise UnsupportedCheckpointError(
                    f"Rank {r} records other AutoEP layers, placements or affine maps than rank 0.",
                    hint="The model-states files come from different runs, or one is damaged.",
                )
        if any(len(rank.groups) != len(param_shapes) for rank in ranks):
            raise UnsupportedCheckpointError(
                f"The optimizer files' partition groups do not match the {len(param_shapes)} parameter groups.",
                hint="An optimizer file is damaged or comes from another run.",
            )
        for g, shapes in enumerate(param_shapes):
            dps = _dp_groups(g, ranks, ws)
            families = {f for rank in ranks for f in rank.groups[g].families}
            if families == {"autoep_expert"}:
                experts.add(g)
            elif dps != [tuple(range(ws))]:
                raise UnsupportedCheckpointError(
                    f"Optimizer sub-group {g} ({', '.join(sorted(families))}) is partitioned over "
                    f"{len(dps)} rank groups; only AutoEP's expert groups are.",
                    hint="This layout is not one DeepSpeed 0.19.8's AutoEP writes.",
                )
            first = len(groups)
            local = {dp: _partition(g, shapes, states, dp, lay, groups, rank_groups) for dp in dps}
            if g not in experts:
                lay.params.update({n: replace(t, group=first) for n, t in local[dps[0]].params.items()})
                continue
            ep_of = {dp: _ep_rank(dp, ranks) for dp in dps}
            for name, _ in shapes:
                if name not in maps:
                    raise UnsupportedCheckpointError(
                        f"Expert parameter {name} has no affine map in ds_autoep_layers.",
                        hint="The model-states file is damaged or comes from another run.",
                    )
                lay.params[name] = place(maps[name], {ep_of[dp]: local[dp].params[name] for dp in dps}, first)
        self.expert_groups = frozenset(experts)
        lay.groups = tuple(groups)
        lay.rank_groups = [tuple(rg) for rg in rank_groups]
        self.parallel = _parallel(ranks, ws)
        return lay


def _recorded(records: Mapping[str, T | InspectorError], path: str) -> T | None:
    """The AutoEP record parsed from `path`'s tree (None: the file was not loaded), or its refusal raised."""
    got = records.get(path)
    if isinstance(got, InspectorError):
        raise got
    return got


def _partition(
    g: int,
    shapes: tuple[tuple[str, tuple[int, ...]], ...],
    states: Sequence[OptimStates],
    dp: tuple[int, ...],
    lay: Layout,
    groups: list[GroupInfo],
    rank_groups: list[list[RankGroup]],
) -> Layout:
    """Sub-group g as partitioned over the ranks `dp` (stage-3 arithmetic), its group and rank rows added."""
    index = len(groups)
    sub = [replace(states[r], groups=(states[r].groups[g],), partition_count=None) for r in dp]
    part = stage3_layout((shapes,), sub)
    lay.findings += part.findings
    if part.master_dtype != "float32":
        lay.master_dtype = part.master_dtype
    groups += [replace(gi, index=index) for gi in part.groups]
    for d, r in enumerate(dp):
        rank_groups[r] += [replace(rg, group=index) for rg in part.rank_groups[d]]
    return part


def _shared(layer: AutoEPLayer) -> tuple[object, ...]:
    """What every rank records alike about a layer (the rest is the rank's own place)."""
    return (
        layer.layer_id,
        layer.module_path,
        layer.num_experts,
        layer.ep_size,
        layer.placement,
        layer.params,
    )


def _dp_groups(g: int, ranks: Sequence[_Rank], ws: int) -> list[tuple[int, ...]]:
    """The rank groups that partition sub-group g, each in partition order, checked against every member."""
    out: list[tuple[int, ...]] = []
    for r, rank in enumerate(ranks):
        pg = rank.groups[g]
        dp = pg.ranks
        if any(x >= ws for x in dp) or dp[pg.rank] != r:
            raise UnsupportedCheckpointError(
                f"Rank {r}'s optimizer file says it is partition {pg.rank} of ranks {list(dp)} in sub-group {g}.",
                hint="A rank file was copied or renamed into another rank's place, or the file is damaged.",
            )
        if dp not in out:
            out.append(dp)
    covered = sorted(x for dp in out for x in dp)
    if covered != list(range(ws)):
        raise UnsupportedCheckpointError(
            f"The partition groups of sub-group {g} overlap or leave ranks out.",
            hint="Rank files are missing, mixed or damaged.",
        )
    return out


def _ep_rank(dp: tuple[int, ...], ranks: Sequence[_Rank]) -> int:
    """The expert-parallel rank that a group of expert-data-parallel ranks shares (each rank records it)."""
    seen = {layer.ep_rank for r in dp for layer in ranks[r].layers}
    if len(seen) != 1 or None in seen:
        raise UnsupportedCheckpointError(
            f"Ranks {list(dp)} partition one expert group but record expert-parallel ranks {sorted(map(str, seen))}.",
            hint="The model-states files are damaged or come from different runs.",
        )
    return int(next(iter(seen)) or 0)


def _router_aliases(model: ModelStates, layers: Sequence[AutoEPLayer]) -> dict[str, str]:
    """`<layer>.gate.X` → `<layer>.router.X`: AutoEP registers its router under the replaced block's name too,
    so the module state lists it twice while param_shapes lists it once."""
    owned = {n for group in model.param_shapes or () for n, _ in group}
    out: dict[str, str] = {}
    for layer in layers:
        head = layer.module_path + "."
        for name in model.module:
            if not name.startswith(head) or name in owned:
                continue
            _, _, rest = name[len(head) :].partition(".")
            owner = f"{head}router.{rest}"
            if rest and owner in owned:
                out[name] = owner
    return out


def _parallel(ranks: Sequence[_Rank], ws: int) -> Parallel:
    """Which ranks hold which global experts of each layer (from each rank's own ep_rank and placement)."""
    rows = []
    ep = 1
    for i, layer in enumerate(ranks[0].layers):
        ep = max(ep, layer.ep_size)
        by_ep: dict[int, list[int]] = {}
        for r, rank in enumerate(ranks):
            mine = rank.layers[i] if i < len(rank.layers) else None
            if mine is not None and mine.ep_rank is not None:
                by_ep.setdefault(mine.ep_rank, []).append(r)
        rows.append(holding(layer.expert_prefix, layer.placement, by_ep))
    return Parallel("expert", ep=ep, dp=ws, placement=tuple(rows), autoep=True)


__all__ = ["is_autoep", "scan_autoep"]
