"""`build_plan` alone: selection, names, dtypes, tied dedupe, sharding and safetensors headers.

Plans are pure, so nothing here writes to disk except the cached demo checkpoints the plans are built from.
Headers are checked by parsing them by hand and by handing them (with zeroed data) to safetensors itself.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import safetensors.torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import (
    INDEX_NAME,
    META_KEY,
    SAFETENSORS_DTYPES,
    SINGLE_NAME,
    ConversionPlan,
    PlannedTensor,
    build_plan,
)
from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Checkpoint, Kind
from inspector.scan.scanner import scan

if TYPE_CHECKING:
    from conftest import DemoCache

BF16 = DemoSpec(stage=2, world_size=2, dtype="bf16", params=100_000)
FP16 = DemoSpec(stage=3, world_size=2, dtype="fp16", params=80_000)
FP32 = DemoSpec(stage=2, world_size=5, dtype="fp32", params=60_000)
SHARD_NAME = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
OWNER, ALIAS = "model.embed_tokens.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def ckpt(demo: DemoCache) -> Checkpoint:
    """A bf16 stage-2 demo with a frozen table, fp32 and int64 buffers and a tied lm_head."""
    return scan(str(demo(BF16)))


@pytest.fixture(scope="module")
def ckpt_fp16(demo: DemoCache) -> Checkpoint:
    return scan(str(demo(FP16)))


@pytest.fixture(scope="module")
def ckpt_fp32(demo: DemoCache) -> Checkpoint:
    return scan(str(demo(FP32)))


def stored(plan: ConversionPlan) -> list[PlannedTensor]:
    """Every tensor the plan writes, in file order."""
    return [t for s in plan.shards for t in s.tensors]


def names(plan: ConversionPlan) -> list[str]:
    return [t.name for t in stored(plan)]


def parse_header(header: bytes) -> dict[str, Any]:
    """Parse a safetensors header the way the format defines it: u64 little-endian length, then JSON."""
    n = int.from_bytes(header[:8], "little")
    assert len(header) == 8 + n, "header length field does not match the header"
    parsed = json.loads(header[8:])
    assert isinstance(parsed, dict)
    return parsed


def meta_of(plan: ConversionPlan) -> dict[str, Any]:
    """Our JSON metadata from the first shard's header."""
    return json.loads(parse_header(plan.shards[0].header)["__metadata__"][META_KEY])


def check_invariants(plan: ConversionPlan, ckpt: Checkpoint) -> None:
    """What must hold for any plan: shard limits, names, index, headers, sizes."""
    opts = plan.options
    shards = plan.shards
    n = len(shards)
    assert n >= 1
    # sharding: over the limit only when a single tensor is bigger; greedy packing never splits needlessly
    for s in shards:
        assert s.tensors, f"{s.filename} is empty"
        assert s.data_bytes == sum(t.nbytes for t in s.tensors)
        if s.data_bytes > opts.shard_size:
            assert len(s.tensors) == 1, f"{s.filename} exceeds shard_size with {len(s.tensors)} tensors"
    for prev, nxt in itertools.pairwise(shards):
        assert prev.data_bytes + nxt.tensors[0].nbytes > opts.shard_size, (
            "a tensor moved to a new shard needlessly"
        )
    # HF file names
    if n == 1:
        assert [s.filename for s in shards] == [SINGLE_NAME]
        assert plan.index is None
        assert plan.filenames == [SINGLE_NAME]
    else:
        for i, s in enumerate(shards):
            m = SHARD_NAME.match(s.filename)
            assert m, s.filename
            assert (int(m.group(1)), int(m.group(2))) == (i + 1, n)
        assert plan.index is not None
        index = json.loads(plan.index)
        assert index["metadata"]["total_size"] == sum(t.nbytes for t in stored(plan)) == plan.tensor_bytes
        assert index["weight_map"] == {t.name: s.filename for s in shards for t in s.tensors}
        assert plan.filenames == [s.filename for s in shards] + [INDEX_NAME]
    # names unique; order follows the checkpoint
    out = names(plan)
    assert len(out) == len(set(out))
    order = {t.name: i for i, t in enumerate(ckpt.tensors)}
    src = [order[t.source] for t in stored(plan)]
    assert src == sorted(src)
    # sizes
    for t in stored(plan):
        info = ckpt.tensor(t.source)
        assert t.shape == info.shape
        assert t.nbytes == info.numel * itemsize(t.out_dtype)
        assert sum(s.numel for s in t.segments) == info.numel
    assert plan.output_bytes == sum(len(s.header) + s.data_bytes for s in shards) + len(plan.index or b"")
    for s in shards:
        check_header(s.header, s.tensors, s.data_bytes)


def check_header(header: bytes, tensors: tuple[PlannedTensor, ...], data_bytes: int) -> None:
    """A valid safetensors header: aligned, string metadata, contiguous offsets from 0, right dtypes."""
    assert len(header) % 8 == 0, "data must start 8-byte aligned"
    parsed = parse_header(header)
    meta = parsed.pop("__metadata__")
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    assert meta["format"] == "pt"
    assert list(parsed) == [t.name for t in tensors]
    pos = 0
    for t in tensors:
        entry = parsed[t.name]
        assert entry["dtype"] == SAFETENSORS_DTYPES[t.out_dtype]
        assert tuple(entry["shape"]) == t.shape
        assert entry["data_offsets"] == [pos, pos + t.nbytes] == [t.offset, t.offset + t.nbytes]
        pos += t.nbytes
    assert pos == data_bytes
    # and safetensors itself accepts the file this header starts (data zeroed)
    loaded = safetensors.torch.load(header + bytes(data_bytes))
    assert set(loaded) == {t.name for t in tensors}


# --- selection ------------------------------------------------------------------------------------------------


def test_default_selects_every_tensor(ckpt: Checkpoint) -> None:
    """Trainable, frozen, buffers and the tied alias (as its own copy) are all written by default."""
    plan = build_plan(ckpt, ConvertOptions())
    assert names(plan) == [t.name for t in ckpt.tensors]
    kinds = {t.kind for t in stored(plan)}
    assert kinds == {Kind.TRAINABLE, Kind.FROZEN, Kind.BUFFER, Kind.TIED}
    assert plan.aliases == {}
    assert plan.tensor_count == len(ckpt.tensors)
    assert meta_of(plan)["filtered"] is False
    check_invariants(plan, ckpt)


@pytest.mark.parametrize(
    ("include", "exclude", "want"),
    [
        (("*.q_proj.*",), (), lambda n: ".q_proj." in n),
        (("model.layers.0",), (), lambda n: n.startswith("model.layers.0.")),
        (("model.layers.0.",), (), lambda n: n.startswith("model.layers.0.")),
        (("model.norm.weight",), (), lambda n: n == "model.norm.weight"),
        ((), ("model.layers",), lambda n: not n.startswith("model.layers.")),
        ((), ("*.weight",), lambda n: not n.endswith(".weight")),
        (
            ("model.layers.1", "lm_head"),
            ("*norm*",),
            lambda n: (n.startswith("model.layers.1.") or n == ALIAS) and "norm" not in n,
        ),
    ],
)
def test_include_exclude(
    ckpt: Checkpoint, include: tuple[str, ...], exclude: tuple[str, ...], want: Any
) -> None:
    """Globs match whole names; a bare module path selects the whole submodule."""
    plan = build_plan(ckpt, ConvertOptions(include=include, exclude=exclude))
    expect = [t.name for t in ckpt.tensors if want(t.name)]
    assert expect and len(expect) < len(ckpt.tensors)
    assert names(plan) == expect
    assert meta_of(plan)["filtered"] is True
    check_invariants(plan, ckpt)


def test_module_prefix_stops_at_a_dot(ckpt: Checkpoint) -> None:
    """`model.layers.1` is a submodule, so it must not pick up `model.layers.10`."""
    extra = replace(
        ckpt.tensor("model.layers.1.mlp.up_proj.weight"), name="model.layers.10.mlp.up_proj.weight"
    )
    wide = replace(ckpt, tensors=(*ckpt.tensors, extra))
    plan = build_plan(wide, ConvertOptions(include=("model.layers.1",)))
    assert "model.layers.10.mlp.up_proj.weight" not in names(plan)
    assert names(plan) and all(n.startswith("model.layers.1.") for n in names(plan))


@pytest.mark.parametrize(
    ("opts", "gone"),
    [
        (ConvertOptions(exclude_frozen=True), {Kind.FROZEN}),
        (ConvertOptions(exclude_buffers=True), {Kind.BUFFER}),
        (ConvertOptions(exclude_frozen=True, exclude_buffers=True), {Kind.FROZEN, Kind.BUFFER}),
    ],
)
def test_exclude_kinds(ckpt: Checkpoint, opts: ConvertOptions, gone: set[Kind]) -> None:
    plan = build_plan(ckpt, opts)
    assert names(plan) == [t.name for t in ckpt.tensors if t.kind not in gone]
    check_invariants(plan, ckpt)


def test_empty_selection_is_an_error(ckpt: Checkpoint) -> None:
    with pytest.raises(InspectorError, match="No tensors match") as exc:
        build_plan(ckpt, ConvertOptions(include=("no.such.module",)))
    assert exc.value.title == "Empty selection"
    assert "--include" in exc.value.hint and "--exclude" not in exc.value.hint  # only the flag given


def test_nothing_to_convert_without_flags_blames_no_flag(ckpt: Checkpoint) -> None:
    """A forced conversion of a scan that found no readable tensor says so, not "check --include"."""
    empty = replace(ckpt, tensors=[])
    with pytest.raises(InspectorError, match="found no tensor it can write") as exc:
        build_plan(empty, ConvertOptions())
    assert exc.value.title == "Nothing to convert"
    assert "--include" not in exc.value.message + exc.value.hint


def test_a_checkpoint_with_no_tensor_names_no_flag_the_user_did_not_pass(ckpt: Checkpoint) -> None:
    """A damaged checkpoint forced through whose scan kept no tensor: not "no tensors match --include"."""
    from dataclasses import replace

    with pytest.raises(InspectorError, match="found no tensor") as exc:
        build_plan(replace(ckpt, tensors=()), ConvertOptions())
    assert exc.value.title == "Nothing to convert"
    assert "--include" not in exc.value.hint + str(exc.value)


# --- names ----------------------------------------------------------------------------------------------------


def test_strip_prefix(ckpt: Checkpoint) -> None:
    """The first matching prefix is removed; names without it are left alone; metadata maps them back."""
    plan = build_plan(ckpt, ConvertOptions(strip_prefix=("model.", "lm_")))
    by_source = {t.source: t.name for t in stored(plan)}
    assert by_source[OWNER] == "embed_tokens.weight"
    assert by_source["model.layers.0.self_attn.q_proj.weight"] == "layers.0.self_attn.q_proj.weight"
    assert by_source[ALIAS] == "head.weight"
    renamed = meta_of(plan)["renamed"]
    assert renamed == {out: src for src, out in by_source.items() if out != src}
    check_invariants(plan, ckpt)


def test_regex_renames_apply_in_order_after_strip(ckpt: Checkpoint) -> None:
    opts = ConvertOptions(
        strip_prefix=("model.",),
        renames=((r"^layers\.(\d+)\.", r"h.\1."), (r"self_attn\.", "attn."), (r"^h\.", "blocks.")),
    )
    plan = build_plan(ckpt, opts)
    by_source = {t.source: t.name for t in stored(plan)}
    assert by_source["model.layers.1.self_attn.k_proj.weight"] == "blocks.1.attn.k_proj.weight"
    assert by_source["model.layers.0.mlp.up_proj.weight"] == "blocks.0.mlp.up_proj.weight"
    assert by_source["model.norm.weight"] == "norm.weight"
    check_invariants(plan, ckpt)


@pytest.mark.parametrize(
    "opts",
    [
        ConvertOptions(renames=((r"layers\.\d+\.", "layers.X."),)),
        ConvertOptions(renames=((r"\.(q|k)_proj", ".qk_proj"),)),
        ConvertOptions(strip_prefix=("model.",), renames=((r"^embed_tokens", "lm_head"),)),
    ],
)
def test_name_collision_is_an_error(ckpt: Checkpoint, opts: ConvertOptions) -> None:
    with pytest.raises(InspectorError, match="would both be written as") as exc:
        build_plan(ckpt, opts)
    assert exc.value.title == "Name collision"


@pytest.mark.parametrize(
    ("repl", "why"), [("", "is empty"), ("__metadata__", "reserved"), ("a/../b", "path separator"), ("x\x1b[2J", "control")]
)
def test_rename_to_an_unsafe_name_is_an_error(ckpt: Checkpoint, repl: str, why: str) -> None:
    """Output names pass the same rule as names read from a file (`__metadata__` made the file unloadable)."""
    with pytest.raises(InspectorError, match=why) as err:
        build_plan(ckpt, ConvertOptions(include=("model.norm.weight",), renames=((r"^.*$", repl),)))
    assert "\x1b" not in str(err.value)


@pytest.mark.parametrize("pattern", ["(", "[a-", "*x", r"(?P<a>x)(?P<a>y)"])
def test_bad_regex_is_an_error(ckpt: Checkpoint, pattern: str) -> None:
    with pytest.raises(InspectorError, match="Bad --rename pattern") as exc:
        build_plan(ckpt, ConvertOptions(renames=((pattern, "x"),)))
    assert exc.value.title == "Invalid option"


@pytest.mark.parametrize(
    "opts", [ConvertOptions(dtype="int8"), ConvertOptions(dtype="fp64"), ConvertOptions(shard_size=0)]
)
def test_bad_options_are_errors(ckpt: Checkpoint, opts: ConvertOptions) -> None:
    with pytest.raises(InspectorError):
        build_plan(ckpt, opts)


# --- dtypes ---------------------------------------------------------------------------------------------------


def out_dtypes(plan: ConversionPlan) -> dict[str, str]:
    return {t.source: t.out_dtype for t in stored(plan)}


@pytest.mark.parametrize(
    ("fixture", "auto"), [("ckpt", "bfloat16"), ("ckpt_fp16", "float16"), ("ckpt_fp32", "float32")]
)
def test_auto_dtype_is_the_compute_dtype(request: pytest.FixtureRequest, fixture: str, auto: str) -> None:
    """auto = the training compute dtype for every floating tensor; the int64 buffer keeps int64."""
    ck: Checkpoint = request.getfixturevalue(fixture)
    plan = build_plan(ck, ConvertOptions())
    for t in stored(plan):
        assert t.out_dtype == ("int64" if t.source == "model.tokens_seen" else auto), t.source
        assert t.src_dtype == ck.tensor(t.source).dtype
    check_invariants(plan, ck)


@pytest.mark.parametrize(
    ("dtype", "want"),
    [
        ("fp32", "float32"),
        ("bf16", "bfloat16"),
        ("fp16", "float16"),
        ("float16", "float16"),
        ("BF16", "bfloat16"),
    ],
)
def test_explicit_dtype(ckpt: Checkpoint, dtype: str, want: str) -> None:
    plan = build_plan(ckpt, ConvertOptions(dtype=dtype))
    got = out_dtypes(plan)
    assert got.pop("model.tokens_seen") == "int64"
    assert set(got.values()) == {want}
    check_invariants(plan, ckpt)


def test_keep_fp32_patterns(ckpt: Checkpoint) -> None:
    """Matching floating tensors stay fp32 (globs and module prefixes, on source names); integers untouched."""
    plan = build_plan(
        ckpt, ConvertOptions(dtype="bf16", keep_fp32=("*norm*", "model.rotary_emb", "model.tokens_seen"))
    )
    got = out_dtypes(plan)
    keep = {n for n in got if "norm" in n or n.startswith("model.rotary_emb.")}
    assert len(keep) >= 4
    for name, dtype in got.items():
        want = "float32" if name in keep else "int64" if name == "model.tokens_seen" else "bfloat16"
        assert dtype == want, name
    check_invariants(plan, ckpt)


# --- tied weights ---------------------------------------------------------------------------------------------


def test_dedupe_tied_stores_the_owner_once(ckpt: Checkpoint) -> None:
    plan = build_plan(ckpt, ConvertOptions(dedupe_tied=True))
    assert ALIAS not in names(plan)
    assert OWNER in names(plan)
    assert plan.aliases == {ALIAS: OWNER}
    assert meta_of(plan)["aliases"] == {ALIAS: OWNER}
    full = build_plan(ckpt, ConvertOptions())
    assert full.tensor_bytes - plan.tensor_bytes == ckpt.tensor(OWNER).numel * 2  # bf16 copy saved
    check_invariants(plan, ckpt)


def test_dedupe_tied_with_renames_maps_both_ends(ckpt: Checkpoint) -> None:
    """The alias record uses output names; `renamed` lets verify find the alias's source again."""
    plan = build_plan(
        ckpt, ConvertOptions(dedupe_tied=True, strip_prefix=("model.",), renames=((r"^lm_head", "head"),))
    )
    assert plan.aliases == {"head.weight": "embed_tokens.weight"}
    meta = meta_of(plan)
    assert meta["aliases"] == {"head.weight": "embed_tokens.weight"}
    assert meta["renamed"]["head.weight"] == ALIAS
    assert meta["renamed"]["embed_tokens.weight"] == OWNER


def test_dedupe_tied_keeps_alias_when_owner_is_not_selected(ckpt: Checkpoint) -> None:
    plan = build_plan(ckpt, ConvertOptions(dedupe_tied=True, exclude=(OWNER,)))
    assert ALIAS in names(plan)
    assert plan.aliases == {}
    check_invariants(plan, ckpt)


# --- sharding -------------------------------------------------------------------------------------------------


def test_single_file_when_it_fits(ckpt: Checkpoint) -> None:
    plan = build_plan(ckpt, ConvertOptions())
    assert [s.filename for s in plan.shards] == [SINGLE_NAME]
    exact = build_plan(ckpt, ConvertOptions(shard_size=plan.tensor_bytes))
    assert [s.filename for s in exact.shards] == [SINGLE_NAME]
    split = build_plan(ckpt, ConvertOptions(shard_size=plan.tensor_bytes - 1))
    assert len(split.shards) == 2
    check_invariants(split, ckpt)


@pytest.mark.parametrize("shard_size", [1, 1000, 10_000, 50_000, 90_000, 150_000])
def test_sharding(ckpt: Checkpoint, shard_size: int) -> None:
    plan = build_plan(ckpt, ConvertOptions(shard_size=shard_size))
    assert len(plan.shards) > 1
    if shard_size == 1:
        assert len(plan.shards) == len(ckpt.tensors), "every tensor is bigger than 1 byte"
    largest = max(t.nbytes for t in stored(plan))
    for s in plan.shards:
        assert s.data_bytes <= max(shard_size, largest)
    check_invariants(plan, ckpt)


def test_buffers_are_capped_by_the_largest_tensor(ckpt: Checkpoint) -> None:
    """Chunk buffers never exceed what the biggest tensor needs, nor the chunk size."""
    big = build_plan(ckpt, ConvertOptions())
    largest = max(t.numel for t in stored(big))
    # bf16 out from fp32 sources: 3 chunks x (4 source + 2 output) bytes per element; buffers are sized
    # in bytes, so the int64 scalar buffer does not widen them
    assert big.buffer_bytes == 3 * largest * (4 + 2)
    small = build_plan(ckpt, ConvertOptions(chunk_elems=1000))
    assert small.buffer_bytes == 3 * 1000 * (4 + 2)


def test_fingerprint_identifies_the_job(ckpt: Checkpoint) -> None:
    a = build_plan(ckpt, ConvertOptions())
    assert a.fingerprint == build_plan(ckpt, ConvertOptions()).fingerprint
    assert a.fingerprint != build_plan(ckpt, ConvertOptions(dtype="fp32")).fingerprint
    assert a.fingerprint != build_plan(ckpt, ConvertOptions(shard_size=10_000)).fingerprint
    assert meta_of(a)["job"] == a.fingerprint


def test_metadata_records_the_source(ckpt: Checkpoint) -> None:
    meta = meta_of(build_plan(ckpt, ConvertOptions()))
    assert meta["source_tag"] == ckpt.tag
    assert meta["stage"] == ckpt.stage
    assert meta["world_size"] == ckpt.world_size


# --- property test --------------------------------------------------------------------------------------------


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    shard_size=st.one_of(st.integers(1, 300_000), st.integers(1, 10**10)),
    dtype=st.sampled_from(["auto", "fp32", "bf16", "fp16"]),
    dedupe=st.booleans(),
)
def test_plan_invariants_hold_for_any_shard_size_and_subset(
    ckpt: Checkpoint, data: st.DataObject, shard_size: int, dtype: str, dedupe: bool
) -> None:
    all_names = [t.name for t in ckpt.tensors]
    keep = data.draw(st.lists(st.sampled_from(all_names), min_size=1, unique=True), label="keep")
    excluded = tuple(n for n in all_names if n not in keep)
    plan = build_plan(
        ckpt, ConvertOptions(shard_size=shard_size, exclude=excluded, dtype=dtype, dedupe_tied=dedupe)
    )
    deduped = dedupe and ALIAS in keep and OWNER in keep
    want = [n for n in all_names if n in keep and not (deduped and n == ALIAS)]
    assert names(plan) == want
    assert plan.aliases == ({ALIAS: OWNER} if deduped else {})
    check_invariants(plan, ckpt)


def test_fingerprint_changes_when_the_checkpoint_is_saved_again(tmp_path: Path, demo: DemoCache) -> None:
    """Same tag, same sizes, new bytes: a resumed conversion must not reuse shards of the old save."""
    root = demo.copy(DemoSpec(stage=2, params=50_000), tmp_path / "ck")
    before = build_plan(scan(str(root)), ConvertOptions()).fingerprint
    victim = next((root / "global_step3").glob("*optim_states.pt"))
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert build_plan(scan(str(root)), ConvertOptions()).fingerprint != before
