"""Tensor views read from a pickle: every reference is checked fully before a byte is read.

A view (storage offset, sizes, strides) comes from the pickle, so it is attacker-controlled. Crafted files
are genuine `torch.save` archives whose one tensor is re-described with the view under test (`save_view`),
so the only thing wrong with them is the view. torch itself is the judge of which views are valid: where
`torch.load` accepts a view, our conversion must hold exactly its bytes; where torch refuses it, so must we.
Never exit 0 with other bytes.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.demo.writer import DemoSpec
from inspector.errors import EXIT_DAMAGED, CorruptFileError, InspectorError
from inspector.format.torchzip import load_tree
from inspector.format.views import NO_ATTRS, StorageRef, TensorRef, view_problem, with_attrs
from inspector.scan.scanner import scan
from tests.convert.jobs import execute

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=50_000)
MODEL = "mp_rank_00_model_states.pt"
FROZEN = "model.embed_positions.weight"  # 129 x 27 bf16, a stage-2 frozen parameter: its view is converted
POOL_ELEMS = 4096  # the crafted storage behind the frozen parameter (more than its 3483 elements)


def ref(offset: int, shape: tuple[int, ...], stride: tuple[int, ...], storage_bytes: int = 64) -> TensorRef:
    return TensorRef(
        StorageRef("f.pt", "0", "float32", 1000, storage_bytes), offset, shape, stride, "float32"
    )


@pytest.mark.parametrize(
    ("view", "needle"),
    [
        (ref(-1, (4,), (1,)), "negative storage offset"),
        (ref(0, (4,), (1,), storage_bytes=12), "reaches byte 16 of a 12-byte storage"),
        (ref(0, (2, 2), (1,)), "2 sizes but 1 strides"),
        (ref(0, (-2,), (1,)), "negative size"),
        (ref(3, (2,), (-1,)), "negative stride"),
        (ref(9, (4, 2), (1, 4)), "reaches byte 68"),  # transposed, one element too far
        (ref(17, (0,), (1,)), "offset past the end"),
        (ref(0, (2**62, 2**62), (0, 0)), "does not fit in 64 bits"),  # a broadcast of 2**124 elements
        (ref(2**64, (0,), (1,)), "does not fit in 64 bits"),
    ],
)
def test_view_problem_names_the_fault(view: TensorRef, needle: str) -> None:
    assert needle in view_problem(view)


@pytest.mark.parametrize(
    "view",
    [
        ref(0, (4, 4), (4, 1)),
        ref(1, (3, 5), (1, 3)),  # a transpose, ends exactly at the storage end
        ref(15, (), ()),
        ref(0, (4, 3), (0, 1)),  # broadcast (stride 0) is a legal view
        ref(16, (0, 5), (5, 1)),
    ],
)
def test_view_problem_accepts_real_views(view: TensorRef) -> None:
    assert view_problem(view) == ""


# --- crafting real files ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _view_override(
    target: torch.Tensor, storage: torch.Tensor, offset: int, shape: Any, stride: Any
) -> Iterator[None]:
    """While saving, pickle `target` as a view (offset, shape, stride) of `storage`'s bytes."""
    original = torch.Tensor.__reduce_ex__

    def reduce_ex(self: torch.Tensor, proto: int) -> Any:
        if self is not target:
            return original(self, proto)
        typed = torch.storage.TypedStorage(
            wrap_storage=storage.untyped_storage(), dtype=storage.dtype, _internal=True
        )
        return (
            torch._utils._rebuild_tensor_v2,
            (typed, offset, tuple(shape), tuple(stride), False, OrderedDict()),
        )

    torch.Tensor.__reduce_ex__ = reduce_ex  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.__reduce_ex__ = original  # type: ignore[method-assign]


def save_view(root: Path, offset: int, shape: Any, stride: Any) -> torch.Tensor:
    """Rewrite the model file of the checkpoint at `root` so the frozen parameter is the given view of a
    POOL_ELEMS-element bf16 storage of distinct values; returns that storage."""
    tag_dir = next(p for p in root.iterdir() if p.is_dir())
    path = tag_dir / MODEL
    sd = torch.load(path, weights_only=True)
    pool = torch.arange(POOL_ELEMS, dtype=torch.float32).to(torch.bfloat16)
    target = sd["frozen_param_fragments"][FROZEN]
    sd["module"][FROZEN] = target
    with _view_override(target, pool, offset, shape, stride):
        torch.save(sd, path)
    return pool


def torch_view(root: Path) -> torch.Tensor | None:
    """What torch itself makes of the crafted view (None if torch refuses it)."""
    tag_dir = next(p for p in root.iterdir() if p.is_dir())
    try:
        t = torch.load(tag_dir / MODEL, weights_only=True)["frozen_param_fragments"][FROZEN]
        return t.contiguous().clone()
    except Exception:
        return None


def test_negative_offset_is_refused_everywhere(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """Issue 7.1: a negative storage offset read bytes from before the record and exited 0."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    save_view(root, -200, (129, 27), (27, 1))
    assert torch_view(root) is None  # torch refuses it too
    with pytest.raises(CorruptFileError, match="negative storage offset -200"):
        load_tree(next(p for p in root.iterdir() if p.is_dir()) / MODEL)
    out = tmp_path / "out"
    for args in (("scan", root), ("convert", root, out), ("preflight", root)):
        res = cli(*args)
        assert "Traceback" not in res.output, res.output
        assert res.rc == 1, res.output
        assert "negative storage offset" in res.output and MODEL in res.output, res.output
    assert not out.exists()


def convert_view(tmp_path: Path, root: Path) -> torch.Tensor | None:
    """Scan, plan and convert the frozen parameter in-process; None if the tool refuses (a user error)."""
    out = tmp_path / "out"
    try:
        plan = build_plan(scan(str(root)), ConvertOptions(include=(FROZEN,)))
        execute(plan, str(out))
    except InspectorError as exc:
        assert exc.exit_code == EXIT_DAMAGED, exc
        assert not out.exists()
        return None
    return safetensors.torch.load_file(out / "model.safetensors")[FROZEN]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.int16), b.reshape(-1).view(torch.int16))


@pytest.mark.parametrize(
    ("offset", "stride"),
    [(0, (27, 1)), (500, (27, 1)), (3, (1, 129)), (0, (0, 1)), (100, (28, 1))],
    ids=["dense", "offset", "transposed", "broadcast", "padded-rows"],
)
def test_valid_views_convert_exactly(
    tmp_path: Path, demo: DemoCache, offset: int, stride: tuple[int, int]
) -> None:
    """Views torch accepts (offsets, transposes, broadcasts, padded rows) are converted to torch's bytes."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    save_view(root, offset, (129, 27), stride)
    truth = torch_view(root)
    got = convert_view(tmp_path, root)
    assert truth is not None and got is not None
    assert same_bits(got, truth)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    offset=st.integers(-5000, 5000),
    shape=st.sampled_from([(129, 27), (27, 129), (3483,), (129, 28), (128, 27)]),
    stride=st.tuples(st.integers(-3, 40), st.integers(-2, 3)),
)
@example(offset=-1, shape=(129, 27), stride=(27, 1))
@example(offset=613, shape=(129, 27), stride=(27, 1))  # ends exactly at the storage end
@example(offset=614, shape=(129, 27), stride=(27, 1))  # one element past it
def test_mutated_views_refuse_or_convert_exactly(
    tmp_path_factory: pytest.TempPathFactory,
    demo: DemoCache,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
) -> None:
    """Any offset/shape/stride: the tool refuses it, or its output equals what torch reads. Never exit 0
    with other bytes."""
    tmp_path = tmp_path_factory.mktemp("view")
    root = demo.copy(SPEC, tmp_path / "ckpt")
    stride = stride[: len(shape)] if len(shape) == 1 else stride
    save_view(root, offset, shape, stride)
    truth = torch_view(root)
    got = convert_view(tmp_path, root)
    if got is not None:
        assert truth is not None, "converted a view torch refuses"
        assert same_bits(got, truth)


def test_tensors_without_attributes_share_one_read_only_mapping() -> None:
    """Thousands of ranks' records hold ~8 tensors a file: one empty mapping for all, never a dict each; a
    tensor subclass's state gets a mapping of its own, which its neighbours never see."""
    s = StorageRef("f", "0", "float32", 0, 16)
    plain, other = TensorRef(s, 0, (4,), (1,), "float32"), TensorRef(s, 0, (2,), (1,), "float32")
    assert plain.attrs is other.attrs is NO_ATTRS and not plain.attrs
    with pytest.raises(TypeError):
        plain.attrs["x"] = 1  # type: ignore[index]
    with_attrs(plain, {"ds_id": "0_1"})
    with_attrs(plain, {"ds_shape": (4,)})
    assert dict(plain.attrs) == {"ds_id": "0_1", "ds_shape": (4,)}
    assert other.attrs is NO_ATTRS and not NO_ATTRS
