"""DeepSpeed's model-states and optimizer-states files as frozen, typed records (FORMAT.md §2).

Each record is built from an unpickled tree through `parse.tree.Node`, so a value of the wrong type, sign or
size is refused as one `InputError` naming the file and field, and every name passes the one name rule. The
robust-reader checklist of FORMAT.md §6 is honoured: optional keys, `zero_stage` as int or enum or missing
(BF16_Optimizer), `param_shapes` in the optimizer files (before 0.6), the elastic list layout (<= 0.5.9),
plain tuples for shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.dsconfig import DsConfig
from inspector.parse.reparse import parsed
from inspector.parse.tree import Node, once

MAX_WORLD = 1 << 24  # data-parallel ranks a record may claim; the files present bound it again, with a finding

Shape = tuple[int, ...]
MOMENTS = ("exp_avg", "exp_avg_sq")
_HYPER = ("lr", "weight_decay", "betas", "eps", "momentum", "name")
Scalar = int | float | TensorRef | None


def _frozen(d: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(d)


_NO_MODULE: Mapping[str, TensorRef] = MappingProxyType({})  # a module parsed with `module=False`


def _param_shapes(node: Node) -> tuple[tuple[tuple[str, Shape], ...], ...] | None:
    """`param_shapes`: one ordered name -> shape mapping per flat group; a name may appear in one group only."""
    if node.is_none():
        return None
    groups = [node] if node.is_mapping() else node.seq(4096)
    seen: dict[str, int] = {}
    out = []
    for g, group in enumerate(groups):
        entries = []
        for name, shape in group.entries("parameter name"):
            if name in seen:
                raise group.fail(f"names parameter {name!r} again (already in group {seen[name]})")
            seen[name] = g
            entries.append((name, shape.shape()))
        out.append(tuple(entries))
    return tuple(out)


def _tensor_map(node: Node, what: str) -> Mapping[str, TensorRef] | None:
    if node.is_none():
        return None
    return _frozen({name: v.tensor() for name, v in node.entries(what)})


@dataclass(frozen=True, slots=True)
class ModelStates:
    """`mp_rank_00_model_states.pt` (stage 0-2) or `zero_pp_rank_D_mp_rank_00_model_states.pt` (stage 3)."""

    file: str
    has_module: bool  # False: `module` is None (a pipeline-parallel run)
    module: Mapping[str, TensorRef]  # tensors only; other values a state_dict may carry are left out
    buffer_names: tuple[str, ...]
    param_shapes: tuple[tuple[tuple[str, Shape], ...], ...] | None
    frozen_param_shapes: Mapping[str, Shape] | None
    frozen_param_fragments: Mapping[str, TensorRef] | None
    shared_params: Mapping[str, str]
    dp_world_size: int | None
    global_steps: int | None
    global_samples: int | None
    ds_version: str | None
    ds_config: DsConfig = field(default_factory=DsConfig)

    @classmethod
    def parse(cls, tree: Any, file: str, module: bool = True) -> ModelStates:
        """`module=False`: the module's names checked, its tensors not kept (another stage-3 rank's
        placeholders, which nothing reads: rank 0's name the tensors). A tree rebuilt from a pickle parsed
        before takes that record, in its own tensors and name (`reparse`)."""
        return parsed(tree, file, (cls, module), lambda: cls._parse(tree, file, module))

    @classmethod
    def _parse(cls, tree: Any, file: str, module: bool) -> ModelStates:
        root = Node(tree, file)
        if not root.is_mapping() or not root.has("module"):
            raise root.fail("is not a DeepSpeed model-states file (no `module` key)")
        module_node = root.at("module")
        tensors: dict[str, TensorRef] = {}
        if not module_node.is_none() and not module:
            module_node.names("tensor name")
        elif not module_node.is_none():
            for name, v in module_node.entries("tensor name"):
                if isinstance(v.value, TensorRef):
                    tensors[name] = v.value
        buffers = root.at("buffer_names")
        shared = root.at("shared_params")
        frozen_shapes = root.at("frozen_param_shapes")
        config = root.at("ds_config")
        return cls(
            file=file,
            has_module=not module_node.is_none(),
            module=_frozen(tensors) if tensors or module else _NO_MODULE,
            buffer_names=tuple(b.name("buffer name") for b in buffers.seq()) if not buffers.is_none() else (),
            param_shapes=once(_param_shapes, root.at("param_shapes")),
            frozen_param_shapes=None
            if frozen_shapes.is_none()
            else _frozen({n: s.shape() for n, s in frozen_shapes.entries("frozen parameter name")}),
            frozen_param_fragments=_tensor_map(root.at("frozen_param_fragments"), "frozen parameter name"),
            shared_params=_frozen(
                {a: o.name("tied parameter name") for a, o in shared.entries("tied parameter name")}
            )
            if not shared.is_none()
            else _frozen({}),
            dp_world_size=root.at("dp_world_size").opt_integer(1, MAX_WORLD),
            global_steps=_counter(root.at("global_steps")),
            global_samples=_counter(root.at("global_samples")),
            ds_version=_version(root.at("ds_version")),
            ds_config=once(DsConfig.parse, config),
        )


def _counter(node: Node) -> int | None:
    """A training counter: shown, never computed with; anything but a sane int is simply not shown."""
    v = node.value
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62 else None


def _version(node: Node) -> str | None:
    """`ds_version`: shown by both faces, so it must pass the name rule (no terminal escapes)."""
    return None if node.is_none() else node.name("DeepSpeed version")


@dataclass(frozen=True, slots=True)
class GroupState:
    """One flat group's (stage 1/2) or sub-group's (stage 3) state on one rank."""

    master: TensorRef  # the fp32 partition (stage 1/2) or the flat sub-group (stage 3)
    moments: Mapping[str, TensorRef] | None  # exp_avg / exp_avg_sq, when both are dense tensors
    step: Scalar
    padding: int | None  # group_paddings[g]
    alignment: tuple[int, ...] | None  # param_alignment_paddings[g]
    partition_count: int | None
    slices: tuple[tuple[str, int, int], ...] | None  # param_slice_mappings[g]: (name, start, numel)
    hyperparams: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OptimStates:
    """A `*_optim_states.pt` file: `DeepSpeedZeroOptimizer`, `BF16_Optimizer` or stage 3."""

    file: str
    stage3: bool
    zero_stage: int | None  # None: BF16_Optimizer (no zero_stage key)
    ds_version: str | None
    ds_config: DsConfig
    groups: tuple[GroupState, ...]
    param_shapes: tuple[tuple[tuple[str, Shape], ...], ...] | None  # DeepSpeed < 0.6 kept them here
    loss_scale: float | None
    dynamic_loss_scale: bool | None
    partition_count: int | None  # stage 3's single int

    @property
    def steps(self) -> tuple[Scalar, ...]:
        return tuple(g.step for g in self.groups)

    @classmethod
    def parse(cls, tree: Any, file: str, stage3: bool) -> OptimStates:
        """A rank file's optimizer record; as `ModelStates.parse`, once per pickle (`reparse`)."""
        return parsed(tree, file, (cls, stage3), lambda: cls._parse(tree, file, stage3))

    @classmethod
    def _parse(cls, tree: Any, file: str, stage3: bool) -> OptimStates:
        root = Node(tree, file)
        if not root.is_mapping():
            raise root.fail("is not a DeepSpeed optimizer-states file")
        osd = root.at("optimizer_state_dict")
        if not osd.is_mapping():
            raise osd.fail("is missing or not a dict; this is not a DeepSpeed ZeRO optimizer file")
        zs = osd.at("zero_stage")
        zero_stage = None if zs.is_none() else zs.integer(0, 3)
        if stage3:
            groups = _stage3_groups(osd)
        else:
            groups = _stage12_groups(osd)
        scaler = osd.at("loss_scaler").value
        scale = getattr(scaler, "__dict__", {}).get("cur_scale") if scaler is not None else None
        count = osd.at("partition_count")
        dyn = osd.at("dynamic_loss_scale").value
        return cls(
            file=file,
            stage3=stage3,
            zero_stage=zero_stage,
            ds_version=_version(root.at("ds_version")),
            ds_config=once(DsConfig.parse, root.at("ds_config")),
            groups=groups,
            param_shapes=once(_param_shapes, osd.at("param_shapes")),
            loss_scale=finite(scale),
            dynamic_loss_scale=dyn if isinstance(dyn, bool) else None,
            partition_count=count.integer(1, 1 << 24) if stage3 and not count.is_none() else None,
        )


def finite(v: Any) -> float | None:
    """A finite float, or None for anything else (absent, inf, NaN, a crafted object)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if f == f and abs(f) != float("inf") else None


def _per_group(osd: Node, key: str, n: int) -> list[Node | None]:
    """`osd[key]` as one entry per group (absent: all None). A list of another length is kept as given, so
    the layout can say the files disagree."""
    node = osd.at(key)
    if node.is_none():
        return [None] * n
    items: list[Node | None] = list(node.seq(4096))
    return items + [None] * (n - len(items)) if len(items) < n else items


def _base_state(osd: Node, stage3: bool) -> tuple[Node | None, list[Node]]:
    """(state, param_groups) of the wrapped torch optimizer; (None, []) for the elastic list layout."""
    base = osd if stage3 else osd.at("base_optimizer_state")
    if base.is_none() or not base.is_mapping():
        if not base.is_none() and not isinstance(base.value, list):
            raise base.fail(f"is a {type(base.value).__name__}, not the optimizer's state dict")
        return None, []  # DeepSpeed <= 0.5.9 (elastic): per-group trimmed state lists, not mapped
    state = base.at("state")
    groups = base.at("param_groups")
    if not state.is_none() and not state.is_mapping():
        raise state.fail(f"is a {type(state.value).__name__}, not a dict")
    return (None if state.is_none() else state), ([] if groups.is_none() else groups.seq(4096))


def _moments(st: Node | None) -> tuple[Mapping[str, TensorRef] | None, Scalar]:
    if st is None or st.is_none():
        return None, None
    if not st.is_mapping():
        raise st.fail(f"is a {type(st.value).__name__}, not a dict of moments")
    got = {}
    for m in MOMENTS:
        v = st.at(m).value
        if isinstance(v, TensorRef) and v.is_contiguous():
            got[m] = v
    step = st.at("step")
    sv = step.value
    scalar: Scalar = sv if isinstance(sv, TensorRef) else (finite(sv) if sv is not None else None)
    if isinstance(sv, int) and not isinstance(sv, bool):
        scalar = step.integer(0, 1 << 62)
    return (_frozen(got) if len(got) == len(MOMENTS) else None), scalar


def _hyper(group: Node | None) -> Mapping[str, Any]:
    if group is None or not group.is_mapping():
        return _frozen({})
    return _frozen({k: group.at(k).json() for k in _HYPER if group.has(k)})


def _group_params(group: Node) -> list[Any]:
    if not group.is_mapping():
        raise group.fail(f"is a {type(group.value).__name__}, not a parameter group")
    params = group.at("params")
    if params.is_none():
        return []
    out = []
    for p in params.seq():
        v = p.value
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise p.fail(f"is a {type(v).__name__}, not a parameter id")
        out.append(v)
    return out


def _state_for(state: Node | None, key: Any) -> Node | None:
    if state is None:
        return None
    try:
        return Node(state.value.get(key), state.file, (state, (key,)))
    except TypeError:
        raise state.fail("has an unusable key") from None


def _stage12_groups(osd: Node) -> tuple[GroupState, ...]:
    masters = osd.at("single_partition_of_fp32_groups")
    if masters.is_none():
        raise masters.fail("is missing: no fp32 master partitions in this optimizer file")
    refs = [m.tensor() for m in masters.seq(4096)]
    n = len(refs)
    state, param_groups = _base_state(osd, stage3=False)
    paddings = _per_group(osd, "group_paddings", n)
    aligns = _per_group(osd, "param_alignment_paddings", n)
    counts = osd.at("partition_count")
    count_list = _per_group(osd, "partition_count", n) if isinstance(counts.value, list | tuple) else None
    count_one = counts.opt_integer(1, 1 << 24) if not isinstance(counts.value, list | tuple) else None
    slices = _per_group(osd, "param_slice_mappings", n)
    out = []
    for g, ref in enumerate(refs):
        pg = param_groups[g] if g < len(param_groups) else None
        key: Any = g
        if pg is not None:
            ids = _group_params(pg)
            key = ids[0] if ids else g
        moments, step = _moments(_state_for(state, key))
        align = aligns[g] if g < len(aligns) else None
        count = count_list[g] if count_list is not None and g < len(count_list) else None
        out.append(
            GroupState(
                master=ref,
                moments=moments,
                step=step,
                padding=_opt_int(paddings[g] if g < len(paddings) else None),
                alignment=None if align is None else tuple(a.integer(0, 1 << 20) for a in align.seq()),
                partition_count=count.integer(1, 1 << 24) if count is not None else count_one,
                slices=_slices(slices[g] if g < len(slices) else None),
                hyperparams=once(_hyper, pg),
            )
        )
    return tuple(out)


def _opt_int(node: Node | None) -> int | None:
    return None if node is None or node.is_none() else node.integer(0, 1 << 48)


def _slices(node: Node | None) -> tuple[tuple[str, int, int], ...] | None:
    """`param_slice_mappings[g]`: name -> fragment_address(start, numel)."""
    if node is None or node.is_none():
        return None
    out = []
    for name, addr in node.entries("parameter name"):
        attrs = getattr(addr.value, "__dict__", None)
        if not isinstance(attrs, dict):
            raise addr.fail(f"is a {type(addr.value).__name__}, not a fragment address")
        start = Node(attrs.get("start"), addr.file, (addr, "start")).integer(0, 1 << 48)
        numel = Node(attrs.get("numel"), addr.file, (addr, "numel")).integer(0, 1 << 48)
        out.append((name, start, numel))
    return tuple(out)


def _stage3_groups(osd: Node) -> tuple[GroupState, ...]:
    flats = osd.at("fp32_flat_groups")
    if flats.is_none():
        raise flats.fail("is missing: no fp32 flat groups in this stage-3 optimizer file")
    refs = [f.tensor() for f in flats.seq(1 << 16)]
    inner = osd.at("optimizer_state_dict")
    state: Node | None = None
    param_groups: list[Node] = []
    if inner.is_mapping():
        state, param_groups = _base_state(inner, stage3=True)
    owner: dict[int, Node] = {}
    for pg in param_groups:
        for pid in _group_params(pg):
            if isinstance(pid, int):
                owner.setdefault(pid, pg)
    out = []
    for g, ref in enumerate(refs):
        moments, step = _moments(_state_for(state, g))
        out.append(GroupState(ref, moments, step, None, None, None, None, once(_hyper, owner.get(g))))
    return tuple(out)
