"""The files of pipeline-, expert- and tensor-parallel runs as frozen, typed records (FORMAT.md §1.2, §3.6,
§3.7 and "Expert, pipeline and tensor parallel files").

A layer or expert file is a plain `state_dict` (name -> tensor); the parallel degrees live in the stage's
model-states file (its ZeRO-off optimizer wrappers: `parse.zero_off`). Every name passes the one name rule and every
number is bounded, as in `parse.states`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.affine import Layout, parse_map
from inspector.parse.states import MAX_WORLD
from inspector.parse.tree import Node

MAX_DEGREE = 1 << 16  # pipeline stages, tensor shards or experts: bounded again by the files present


@dataclass(frozen=True)
class TensorFile:
    """A `layer_XX-model_states.pt` (a pipeline layer's own state_dict, keys without the layer prefix) or a
    `layer_L_expert_E_mp_rank_MM_model_states.pt` (one expert's 16-bit weights under global names)."""

    file: str
    tensors: Mapping[str, TensorRef]

    @classmethod
    def parse(cls, tree: Any, file: str) -> TensorFile:
        root = Node(tree, file)
        if not root.is_mapping():
            raise root.fail("is not a state dict (a mapping of parameter names to tensors)")
        out: dict[str, TensorRef] = {}
        for name, v in root.entries("parameter name"):
            out[name] = v.tensor()
        return cls(file, MappingProxyType(out))


@dataclass(frozen=True)
class ParallelDims:
    """What a model-states file says about the run's parallel layout (absent keys: None)."""

    mp_world_size: int | None
    pp_degree: int | None
    tp_degree: int | None
    num_experts: tuple[int, ...] | None  # per MoE layer, in module order (native MoE only)
    dp_world_size: int | None = None

    @property
    def sequence_parallel(self) -> int:
        """The Ulysses sequence-parallel size, or 1. DeepSpeed's SP mpu (ALST, HF's Ulysses integration) makes
        the engine record the SP size as `tp_degree` while `mp_world_size` stays 1 (no real model-parallel
        run has that: TP and PP runs record their degree in `mp_world_size` too): weights are replicated over
        the SP ranks and ZeRO partitions over all ranks, so the files are a plain ZeRO run's."""
        if self.mp_world_size == 1 and self.tp_degree is not None and self.tp_degree > 1:
            return self.tp_degree
        return 1

    @property
    def model_parallel(self) -> int:
        """How many model-parallel ranks write files of their own (mp_rank_MM): 1 under Ulysses SP."""
        if self.sequence_parallel > 1:
            return 1
        return max(self.tp_degree or 1, self.mp_world_size or 1)

    @classmethod
    def parse(cls, tree: Any, file: str) -> ParallelDims:
        root = Node(tree, file)
        if not root.is_mapping():
            raise root.fail("is not a DeepSpeed model-states file")
        dims = root.at("checkpoint_parallel_dimensions")
        pp = tp = None
        if dims.is_mapping():
            pp = dims.at("pp_degree").opt_integer(1, MAX_DEGREE)
            tp = dims.at("tp_degree").opt_integer(1, MAX_DEGREE)
        experts = root.at("num_experts")
        num = None
        if not experts.is_none():
            num = tuple(e.integer(1, MAX_DEGREE) for e in experts.seq(MAX_DEGREE))
        return cls(
            root.at("mp_world_size").opt_integer(1, MAX_DEGREE),
            pp,
            tp,
            num,
            root.at("dp_world_size").opt_integer(1, MAX_WORLD)  # as ModelStates reads it: one rule,
        )


_REGEX_SPECIAL = frozenset(".^$*+?{}[]\\|()")
_RECIPES = {  # universal_checkpoint_info key -> how the shards of a matching parameter join (FORMAT.md §4.2)
    "tp_replicated_parameter_patterns": "replicated",
    "parameter_with_row_parallelism_patterns": "row",
    "vocabulary_parameter_patterns": "vocab",
    "parameter_with_2_sub_params_cat_dim_0": "2-sub-params",  # [a; b] per shard, each half on dim 0
    "parameter_to_average_patterns": "average",
}


def literal_pattern(pattern: str) -> str | None:
    """The parameter name an anchored, escaped pattern (`^a\\.b$`, what AutoTP writes) stands for; None for
    any other regex. Patterns come from the file: they are never compiled (a crafted one could backtrack
    for hours), only read back as the literal names AutoTP escaped."""
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        return None
    out = []
    body = pattern[1:-1]
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body) or body[i + 1].isalnum():
                return None
            out.append(body[i + 1])
            i += 2
            continue
        if c in _REGEX_SPECIAL:
            return None
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class SubParams:
    """One `parameter_with_sub_params` entry: a fused parameter (`qkv_proj`, `gate_up_proj`) whose shards each
    hold a piece of every sub-parameter along `partition_dim`. `sizes`: the sub-parameters' full sizes there
    (UCP's tuple form), or None with `count` equal ones (the form before UCP 0.4); `widths[i][t]`: rows of
    sub-parameter i on shard t (UCP 0.4 `sub_param_shard_widths`), None where not recorded."""

    partition_dim: int
    sizes: tuple[int, ...] | None
    count: int | None
    widths: tuple[tuple[int, ...], ...] | None
    # the entry as recorded, for a universal file's `sub_param_shape` (DeepSpeed's SubparamShape(**entry)):
    # every pattern of the entry, the shape's dims (a tuple for the partition dim's sizes) and whether the
    # shape was pickled as a list
    patterns: tuple[str, ...] = field(default=(), compare=False)
    shape: tuple[int | tuple[int, ...], ...] = field(default=(), compare=False)
    shape_listed: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class TpRecipe:
    """`universal_checkpoint_info` (AutoTP, Megatron-DeepSpeed): how each parameter's tensor-parallel shards
    join. `rules` maps a parameter name to replicated / row (dim 1) / vocab (dim 0, padding cut to
    `original_vocab_size`) / sub-params / average; names it does not list join on dim 0, as DeepSpeed's
    converter does. `regex` counts patterns that are not plain anchored names (not read, see
    `literal_pattern`); `unsupported` are the parameters AutoTP itself marked unconvertible."""

    file: str
    rules: Mapping[str, str]
    unsupported: frozenset[str]
    original_vocab_size: int | None
    regex: tuple[str, ...]
    sub_params: Mapping[str, SubParams] = field(default_factory=lambda: MappingProxyType({}))
    version: float = 0.0  # universal_checkpoint_version: from 0.4 sub-parameters must record their widths
    # parameters an `affine_map` (AutoTP, UCP 0.4) describes: DeepSpeed's converter rebuilds them from it and
    # writes no category keys; `affine_regex`: its patterns that are not plain names (never evaluated)
    affine: frozenset[str] = frozenset()
    affine_regex: tuple[str, ...] = ()
    affine_version: int = 1
    maps: Mapping[str, Layout] = field(default_factory=lambda: MappingProxyType({}))  # by parameter name

    def join_of(self, name: str) -> tuple[str, tuple[int, ...] | str] | None:
        """How `name`'s shards join, as data for the faces to word: ("split", dims), ("replicated", ()),
        ("sub-parameters", (dim,)) or ("rule", category); None where nothing records it (joined on dim 0)."""
        layout = self.maps.get(name)
        if layout is not None:
            return ("split", layout.split_dims) if layout.split_dims else ("replicated", ())
        if name in self.sub_params:
            return "sub-parameters", (self.sub_params[name].partition_dim,)
        rule = self.rules.get(name)
        return ("rule", rule) if rule is not None else None

    @classmethod
    def parse(cls, tree: Any, file: str) -> TpRecipe | None:
        root = Node(tree, file)
        info = root.at("universal_checkpoint_info") if root.is_mapping() else Node(None, file)
        if not info.is_mapping():
            return None
        rules: dict[str, str] = {}
        regex: list[str] = []
        for key, rule in _RECIPES.items():
            node = info.at(key)
            for p in [] if node.is_none() else node.seq(1 << 20):
                name = literal_pattern(p.text(1024))
                if name is None:
                    regex.append(p.text(1024))
                else:
                    rules.setdefault(name, rule)
        bad = info.at("autotp_unsupported_parameter_patterns")
        unsupported = set()
        for pattern, _ in [] if bad.is_none() else bad.entries("pattern", names=False):
            name = literal_pattern(pattern[:1024])
            unsupported.add(name if name is not None else pattern[:1024])
        vocab = info.at("original_vocab_size")
        subs = _sub_params(info, regex)
        for name in subs:
            rules.setdefault(name, "sub-params")
        v = info.at("universal_checkpoint_version").value
        version = float(v) if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e6 else 0.0
        affine, affine_regex, affine_version, maps = _affine(info)
        return cls(
            file,
            MappingProxyType(rules),
            frozenset(unsupported),
            vocab.opt_integer(1, 1 << 40),
            tuple(regex),
            MappingProxyType(subs),
            version,
            affine,
            affine_regex,
            affine_version,
            MappingProxyType(maps),
        )


AFFINE_FORMAT = 1  # the affine-map format DeepSpeed 0.19.8 reads (`AFFINE_MAP_FORMAT_VERSION`)


def _affine(info: Node) -> tuple[frozenset[str], tuple[str, ...], int, dict[str, Layout]]:
    """The parameters `affine_map.params` names (literal patterns), its other patterns, its format version
    and, where DeepSpeed 0.19.8 can read the format, each named parameter's map as a `Layout`."""
    node = info.at("affine_map")
    if not node.is_mapping():
        return frozenset(), (), 1, {}
    version = node.at("version").opt_integer(0, 1 << 20)
    version = AFFINE_FORMAT if version is None else version
    names, regex, maps = set(), [], {}
    params = node.at("params")
    for pattern, entry in [] if params.is_none() else params.entries("pattern", names=False):
        name = literal_pattern(pattern[:1024])
        if name is None:
            regex.append(pattern[:1024])
            continue
        names.add(name)
        if version <= AFFINE_FORMAT:
            maps[name] = parse_map(entry)
    return frozenset(names), tuple(regex), version, maps


_MAX_SUB = 64  # sub-parameters of one fused parameter (qkv: 3, gate_up: 2)


def _dim(d: Node) -> int | tuple[int, ...]:
    """One dim of a sub-parameter shape as recorded: a size (-1: the rest), or the sub-parameters' sizes."""
    if isinstance(d.value, list | tuple):
        return tuple(x.integer(1, 1 << 40) for x in d.seq(_MAX_SUB))
    return d.integer(-1, 1 << 40)


def _sub_params(info: Node, regex: list[str]) -> dict[str, SubParams]:
    """`parameter_with_sub_params` (with UCP 0.4's `sub_param_shard_widths`) by literal parameter name; a
    pattern that is a regex joins `regex` (never evaluated)."""
    widths_node = info.at("sub_param_shard_widths")
    recorded: dict[str, tuple[tuple[int, ...], ...]] = {}
    if not widths_node.is_none():
        for pattern, w in widths_node.entries("pattern", names=False):
            recorded[pattern] = tuple(
                tuple(x.integer(0, 1 << 40) for x in row.seq(MAX_DEGREE)) for row in w.seq(_MAX_SUB)
            )
    out: dict[str, SubParams] = {}
    entries = info.at("parameter_with_sub_params")
    for entry in [] if entries.is_none() else entries.seq(1 << 20):
        dim = entry.at("partition_dim").integer(0, 7)
        shape = entry.at("shape").seq(8)
        if dim >= len(shape):
            raise entry.at("shape").fail(f"has no dimension {dim} (the entry's partition_dim)")
        spec = shape[dim]  # the sub-parameters' sizes (a tuple), or their count (an int, before UCP 0.4)
        sizes = (
            tuple(x.integer(1, 1 << 40) for x in spec.seq(_MAX_SUB))
            if isinstance(spec.value, list | tuple)
            else None
        )
        count = None if sizes is not None else spec.integer(1, _MAX_SUB)
        form = tuple(_dim(d) for d in shape)
        patterns = tuple(p.text(1024) for p in entry.at("patterns").seq(1 << 20))
        listed = isinstance(entry.at("shape").value, list)
        for text in patterns:
            name = literal_pattern(text)
            if name is None:
                regex.append(text)
            else:
                out[name] = SubParams(dim, sizes, count, recorded.get(text), patterns, form, listed)
    return out
