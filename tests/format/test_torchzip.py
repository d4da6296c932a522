"""The zip reader and restricted unpickler against real `torch.save` files, and ptwriter against torch.load.

Every comparison is byte-exact: a TensorRef's runs, read with os.pread, must equal torch's own bytes.
"""

from __future__ import annotations

import math
import os
import pickle
import struct
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inspector.convert.reader import read_ref as read_ref_np
from inspector.errors import CorruptFileError, InspectorError
from inspector.format import ptwriter as pw
from inspector.format.dtypes import numpy_dtype, torch_dtype
from inspector.format.records import Record, ZeroStage
from inspector.format.torchzip import TensorRef, load, load_tree
from inspector.format.zipreader import TorchZip
from tests.conftest import pt_save

# --- helpers --------------------------------------------------------------------------------------------------


def torch_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements in row-major order as raw little-endian bytes (any dtype, any view)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def read_ref(ref: TensorRef) -> torch.Tensor:
    """inspector's reader (numpy) as a torch tensor of the same dtype, bits and shape."""
    a = read_ref_np(ref)
    if a.size == 0:
        return torch.empty(a.shape, dtype=torch_dtype(ref.dtype))
    raw = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy())
    return raw.view(torch_dtype(ref.dtype)).reshape(a.shape)


def ref_bytes(ref: TensorRef) -> bytes:
    """The bytes a TensorRef names, read independently of inspector.convert.reader with os.pread."""
    fd = os.open(ref.path, os.O_RDONLY)
    try:
        out = []
        for off, n in ref.runs():
            chunk = os.pread(fd, n * ref.itemsize, off)
            assert len(chunk) == n * ref.itemsize
            out.append(chunk)
        return b"".join(out)
    finally:
        os.close(fd)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def assert_ref_matches(ref: Any, t: torch.Tensor) -> None:
    """Shape, stride, offset, dtype and bytes of our reference agree with torch's tensor."""
    assert isinstance(ref, TensorRef), type(ref)
    assert ref.shape == tuple(t.shape)
    assert ref.stride == tuple(t.stride())
    assert ref.storage_offset == t.storage_offset()
    assert ref.dtype == dtype_name(t.dtype)
    assert ref.numel == t.numel()
    assert ref_bytes(ref) == torch_bytes(t)


def save(tmp_path: Path, obj: Any, name: str = "obj.pt", **kwargs: Any) -> Path:
    path = tmp_path / name
    torch.save(obj, path, **kwargs)
    return path


def materialise(tree: Any) -> Any:
    """Replace TensorRefs by tensors (via inspector.convert.reader) so trees compare with torch.load's."""
    if isinstance(tree, TensorRef):
        return read_ref(tree)
    if isinstance(tree, OrderedDict):
        return OrderedDict((k, materialise(v)) for k, v in tree.items())
    if isinstance(tree, dict):
        return {k: materialise(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [materialise(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(materialise(v) for v in tree)
    return tree


def assert_same_tree(ours: Any, theirs: Any, where: str = "root") -> None:
    """Structural equality with exact tensor bytes; container types must match too."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: {type(ours)}"
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert torch_bytes(ours) == torch_bytes(theirs), where
        return
    assert type(ours) is type(theirs), f"{where}: {type(ours)} != {type(theirs)}"
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for k in theirs:
            assert_same_tree(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, list | tuple):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_tree(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float) and math.isnan(theirs):
        assert math.isnan(ours), where
    else:
        assert ours == theirs, where


def sample(dtype: torch.dtype, shape: tuple[int, ...] = (5, 7)) -> torch.Tensor:
    """Distinct, non-trivial values of a dtype (so a wrong offset or stride shows)."""
    n = math.prod(shape)
    g = torch.Generator().manual_seed(1234 + n)
    if dtype == torch.bool:
        return (torch.rand(shape, generator=g) > 0.5).to(torch.bool)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


# --- dtypes and views -----------------------------------------------------------------------------------------

LEGACY_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]
# dtypes without a legacy storage class: torch pickles them with _rebuild_tensor_v3 + UntypedStorage;
# looked up through the shared table so an older torch (uint16/32/64 arrived in 2.3) skips what it lacks
V3_DTYPES = [
    d
    for d in map(torch_dtype, ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"))
    if d is not None
]


@pytest.mark.parametrize("dtype", LEGACY_DTYPES, ids=dtype_name)
def test_every_dtype_matches_torch_load(tmp_path: Path, dtype: torch.dtype) -> None:
    """Each dtype: our reference and its bytes equal what torch.load(weights_only=True) returns."""
    t = sample(dtype)
    path = save(tmp_path, {"t": t, "scalar": t.reshape(-1)[3].clone()})
    theirs = torch.load(path, weights_only=True)
    ours = load_tree(path)
    assert_ref_matches(ours["t"], theirs["t"])
    assert_ref_matches(ours["scalar"], theirs["scalar"])
    assert torch_bytes(read_ref(ours["t"])) == torch_bytes(theirs["t"])


@pytest.mark.parametrize("dtype", V3_DTYPES, ids=dtype_name)
def test_rebuild_tensor_v3_dtypes(tmp_path: Path, dtype: torch.dtype) -> None:
    """uint16/32/64 and float8 go through `_rebuild_tensor_v3` with an UntypedStorage (bytes)."""
    t = sample(torch.int64 if not dtype.is_floating_point else torch.float32, (4, 6)).abs().to(dtype)
    path = save(tmp_path, {"t": t, "view": t[1:, ::2]})
    with zipfile.ZipFile(path) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"_rebuild_tensor_v3" in pkl, "torch no longer uses v3 for this dtype; update the test"
    theirs = torch.load(path, weights_only=True)
    ours = load_tree(path)
    assert_ref_matches(ours["t"], theirs["t"])
    assert_ref_matches(ours["view"], theirs["view"])
    assert ours["t"].storage.key == ours["view"].storage.key


def test_storage_offsets_and_shared_storage(tmp_path: Path) -> None:
    """Views into one storage keep their offsets and share one record, as DeepSpeed's flat groups do."""
    flat = torch.arange(100, dtype=torch.float32) * 0.5
    tree = {
        "a": flat[3:13].view(2, 5),
        "b": flat[40:61],
        "whole": flat,
        "other": torch.ones(3),
        "b_again": flat[40:61],
    }
    path = save(tmp_path, tree)
    theirs = torch.load(path, weights_only=True)
    ours = load_tree(path)
    for k in tree:
        assert_ref_matches(ours[k], theirs[k])
    assert ours["a"].storage_offset == 3 and ours["b"].storage_offset == 40
    keys = {k: ours[k].storage.key for k in tree}
    assert keys["a"] == keys["b"] == keys["whole"] == keys["b_again"] != keys["other"]
    assert ours["a"].storage.nbytes == 400  # the record holds the entire storage
    assert ours["b"].offset == ours["whole"].offset + 40 * 4


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.t(),
        lambda x: x[:, ::3],
        lambda x: x[1::2, 2:7:2],
        lambda x: x.reshape(4, 3, 15).permute(2, 0, 1),
        lambda x: x.reshape(4, 3, 15)[:, 1, 2:],
        lambda x: x[:, 4:5],
        lambda x: x[2:3, :].expand(6, 15),
        lambda x: x.reshape(-1).as_strided((5, 4), (3, 2), 1),
        lambda x: x.unsqueeze(1)[1:3],
    ],
    ids=[
        "transpose",
        "column-step",
        "both-step",
        "permute",
        "middle-index",
        "column",
        "expand",
        "overlap",
        "unsq",
    ],
)
def test_non_contiguous_views(tmp_path: Path, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Strided views: runs() walks them in row-major order exactly as torch would copy them."""
    base = sample(torch.float32, (12, 15))
    view = make(base)
    path = save(tmp_path, {"v": view, "base": base})
    theirs = torch.load(path, weights_only=True)
    ours = load_tree(path)
    assert_ref_matches(ours["v"], theirs["v"])
    assert torch.equal(read_ref(ours["v"]), theirs["v"])


def test_zero_dim_and_empty_tensors(tmp_path: Path) -> None:
    """0-d tensors are one element; empty tensors have no runs and an empty record."""
    tree = {
        "scalar_f": torch.tensor(3.25),
        "scalar_i": torch.tensor(-7, dtype=torch.int64),
        "step": torch.tensor(12.0),
        "empty": torch.zeros(0),
        "empty2d": torch.zeros(3, 0, dtype=torch.bfloat16),
        "empty_view": torch.arange(10.0)[5:5],
    }
    path = save(tmp_path, tree)
    theirs = torch.load(path, weights_only=True)
    ours = load_tree(path)
    for k in tree:
        assert_ref_matches(ours[k], theirs[k])
    assert list(ours["scalar_f"].runs()) == [(ours["scalar_f"].offset, 1)]
    assert list(ours["empty"].runs()) == [] and ours["empty"].nbytes == 0
    assert read_ref(ours["scalar_i"]).item() == -7
    assert read_ref(ours["empty2d"]).shape == (3, 0)


def test_parameters_and_tensor_subclass_state(tmp_path: Path) -> None:
    """nn.Parameter (with and without grad) reads as its data; _rebuild_from_type_v2 keeps python state."""
    p = torch.nn.Parameter(sample(torch.float32, (3, 4)))
    frozen = torch.nn.Parameter(sample(torch.bfloat16, (2, 2)), requires_grad=False)
    flat = sample(torch.float32, (9,))
    flat.ds_id = "0_1"  # type: ignore[attr-defined]  # like DeepSpeed's fp32_flat_groups: pickled through _rebuild_from_type_v2
    path = save(tmp_path, {"p": p, "frozen": frozen, "flat": flat, "plist": [p, frozen]})
    theirs = torch.load(path, weights_only=False)
    ours = load_tree(path)
    assert_ref_matches(ours["p"], theirs["p"])
    assert_ref_matches(ours["frozen"], theirs["frozen"])
    assert_ref_matches(ours["flat"], theirs["flat"])
    assert ours["flat"].attrs.get("ds_id") == "0_1"
    assert ours["plist"][0].storage.key == ours["p"].storage.key


def test_containers_and_python_values(tmp_path: Path) -> None:
    """OrderedDict, set, frozenset, bytes, bytearray, tuples, complex, None/bool/float/int/str round-trip."""
    tree = OrderedDict(
        [
            ("od", OrderedDict([("z", 1), ("a", torch.ones(2)), ("m", OrderedDict())])),
            ("set", {1, 2, "three"}),
            ("frozenset", frozenset({4, 5})),
            ("bytes", b"\x00\xffabc"),
            ("bytearray", bytearray(b"xy\x00")),
            ("tuple", (1, (2.5, "x"), (), None)),
            ("list", [True, False, None, -1, 2**70, float("inf"), float("nan")]),
            ("complex", 1.5 - 2j),
            ("str", "ünïcödé"),
            ("nested", {"a": [{"b": (torch.arange(4, dtype=torch.int32),)}]}),
        ]
    )
    path = save(tmp_path, tree)
    theirs = torch.load(path, weights_only=False)
    ours = materialise(load_tree(path))
    assert_same_tree(ours, theirs)


def test_bare_tensor_root_and_torch_size(tmp_path: Path) -> None:
    """A file whose root is a tensor (universal checkpoints) and torch.Size values (param_shapes)."""
    t = sample(torch.float16, (6,))
    path = save(tmp_path, t)
    assert_ref_matches(load_tree(path), torch.load(path, weights_only=True))
    shapes = [OrderedDict([("w", torch.Size([3, 4])), ("b", torch.Size([]))])]
    path2 = save(tmp_path, {"param_shapes": shapes, "dev": torch.device("cpu"), "dt": torch.bfloat16}, "s.pt")
    ours = load_tree(path2)
    assert ours["param_shapes"] == [OrderedDict([("w", (3, 4)), ("b", ())])]
    assert ours["dev"] == "cpu"


def test_data_records_are_64_byte_aligned(tmp_path: Path) -> None:
    """FORMAT §5.1: every storage record of a torch.save file starts on a 64-byte boundary."""
    path = save(tmp_path, {f"t{i}": sample(torch.float32, (i + 1, 3)) for i in range(5)})
    with TorchZip(path) as z:
        records = [n for n in z.entries if "/data/" in n]
        assert len(records) == 5
        for name in records:
            assert z.data_offset(name) % 64 == 0, name
        assert z.byteorder() == "little"


def test_tree_and_archive_stay_usable(tmp_path: Path) -> None:
    """`load` keeps the archive open for reads; entries are found by the archive's own top folder."""
    path = save(tmp_path, {"x": torch.arange(6.0)}, name="mp_rank_00_model_states.pt")
    tree, archive = load(path)
    try:
        assert archive.prefix == "mp_rank_00_model_states/"
        off, size = archive.record(tree["x"].storage.key)
        assert (off, size) == (tree["x"].storage.offset, 24)
        assert archive.read_entry(f"{archive.prefix}version").strip() == b"3"
    finally:
        archive.close()


# --- zip64 ------------------------------------------------------------------------------------------------------


def _central_directory(path: Path) -> list[dict[str, Any]]:
    """Parse the central directory independently (zip64 EOCD -> entries) for assertions."""
    data = path.read_bytes()
    loc = data.rfind(b"PK\x06\x07")
    assert loc > 0, "no zip64 end-of-central-directory locator"
    (eocd64,) = struct.unpack("<Q", data[loc + 8 : loc + 16])
    count, _cd_size, cd_off = struct.unpack("<QQQ", data[eocd64 + 32 : eocd64 + 56])
    out, p = [], cd_off
    for _ in range(count):
        assert data[p : p + 4] == b"PK\x01\x02"
        csize, usize, nlen, xlen, clen = struct.unpack("<LLHHH", data[p + 20 : p + 34])
        (hoff,) = struct.unpack("<L", data[p + 42 : p + 46])
        name = data[p + 46 : p + 46 + nlen].decode()
        extra = data[p + 46 + nlen : p + 46 + nlen + xlen]
        out.append({"name": name, "csize": csize, "usize": usize, "hoff": hoff, "extra": extra})
        p += 46 + nlen + xlen + clen
    return out


def test_zip64_extra_fields_are_honoured(tmp_path: Path) -> None:
    """ptwriter writes 0xFFFFFFFF sizes/offsets with real values in the zip64 extra: we and torch read it."""
    values = sample(torch.float32, (33, 7))
    obj = {
        "w": pw.Tensor(
            pw.Storage("float32", values.numel(), lambda s, c: values.reshape(-1)[s : s + c]), (33, 7)
        )
    }
    path = tmp_path / "z64.pt"
    pt_save(obj, path)
    entries = _central_directory(path)
    assert entries and all(e["csize"] == e["usize"] == e["hoff"] == 0xFFFFFFFF for e in entries)
    assert all(struct.unpack("<H", e["extra"][:2])[0] == 1 for e in entries)  # zip64 extra id
    theirs = torch.load(path, weights_only=True)
    ours = load_tree(path)
    assert torch.equal(theirs["w"], values)
    assert_ref_matches(ours["w"], theirs["w"])
    with TorchZip(path) as z:
        sizes = {n.rsplit("/", 1)[-1]: e.size for n, e in z.entries.items()}
        assert sizes["0"] == values.numel() * 4 and sizes["version"] == 2


def test_zip64_offsets_with_partial_extra(tmp_path: Path) -> None:
    """A zip64 extra that carries only the header offset (sizes fit in 32 bits), as zip tools write."""
    src = save(tmp_path, {"a": torch.arange(10, dtype=torch.int64), "b": torch.ones(3, 3)})
    data = bytearray(src.read_bytes())
    for e in _central_directory(src):
        assert e["extra"] == b"" or e["hoff"] != 0xFFFFFFFF  # torch writes plain 32-bit offsets
    # rewrite every central entry: offset -> 0xFFFFFFFF, real offset in a zip64 extra of 8 bytes
    loc = data.rfind(b"PK\x06\x07")
    (eocd64,) = struct.unpack("<Q", data[loc + 8 : loc + 16])
    count, cd_size, cd_off = struct.unpack("<QQQ", data[eocd64 + 32 : eocd64 + 56])
    new_cd, p = bytearray(), cd_off
    for _ in range(count):
        nlen, xlen, clen = struct.unpack("<HHH", data[p + 28 : p + 34])
        head = bytearray(data[p : p + 46])
        (hoff,) = struct.unpack("<L", head[42:46])
        z64 = struct.pack("<HHQ", 1, 8, hoff)
        head[30:32] = struct.pack("<H", len(z64))
        head[42:46] = struct.pack("<L", 0xFFFFFFFF)
        new_cd += (
            head
            + data[p + 46 : p + 46 + nlen]
            + z64
            + data[p + 46 + nlen + xlen : p + 46 + nlen + xlen + clen]
        )
        p += 46 + nlen + xlen + clen
    tail = bytearray(data[p:])  # zip64 EOCD, locator, EOCD
    delta = len(new_cd) - cd_size
    t64 = eocd64 - p
    tail[t64 + 40 : t64 + 48] = struct.pack("<Q", len(new_cd))
    tloc = loc - p
    tail[tloc + 8 : tloc + 16] = struct.pack("<Q", eocd64 + delta)
    out = tmp_path / "partial_z64.pt"
    out.write_bytes(bytes(data[:cd_off]) + bytes(new_cd) + bytes(tail))
    assert all(e["hoff"] == 0xFFFFFFFF for e in _central_directory(out))
    theirs = torch.load(out, weights_only=True)
    ours = load_tree(out)
    assert_ref_matches(ours["a"], theirs["a"])
    assert_ref_matches(ours["b"], theirs["b"])


# --- ptwriter round trip ----------------------------------------------------------------------------------------


def _producer(values: torch.Tensor) -> Callable[[int, int], np.ndarray[Any, Any]]:
    """ptwriter takes numpy: hand it torch's bytes viewed as the matching numpy dtype."""
    raw = values.contiguous().reshape(-1).view(torch.uint8).numpy()
    flat = raw.view(numpy_dtype(dtype_name(values.dtype)))
    return lambda s, c: flat[s : s + c]


@pytest.mark.parametrize("chunk_elems", [7, 1 << 22])
def test_ptwriter_round_trip_with_torch_load(tmp_path: Path, chunk_elems: int) -> None:
    """Our writer's archives load in torch (weights_only) with identical values, views and containers."""
    dtypes = ["float32", "float16", "bfloat16", "int64", "float64", "int32", "uint8", "bool"]
    tensors: dict[str, torch.Tensor] = {}
    tree: dict[str, Any] = {"meta": OrderedDict([("step", 3), ("name", "x"), ("shape", pw.size((2, 3)))])}
    for i, dt in enumerate(dtypes):
        values = sample(getattr(torch, dt), (4, 5 + i))
        tensors[dt] = values
        tree[dt] = pw.Tensor(pw.Storage(dt, values.numel(), _producer(values)), tuple(values.shape))
    shared_vals = sample(torch.bfloat16, (50,))
    shared = pw.Storage("bfloat16", 50, _producer(shared_vals))
    tree["module"] = OrderedDict(
        [("a.weight", pw.Tensor(shared, (3, 4), 0)), ("b.weight", pw.Tensor(shared, (5, 7), 13))]
    )
    tree["zeros"] = pw.Tensor(pw.Storage("float32", 6), (2, 3))
    tree["scalar"] = pw.Tensor(pw.Storage("float32", 1, lambda s, c: np.full(c, 2.5, np.float32)), ())
    path = tmp_path / "ours.pt"
    pt_save(tree, path, chunk_elems=chunk_elems)

    for weights_only in (True, False):
        back = torch.load(path, weights_only=weights_only)
        for dt, values in tensors.items():
            assert back[dt].dtype == values.dtype and torch_bytes(back[dt]) == torch_bytes(values), dt
        assert torch.equal(back["module"]["a.weight"], shared_vals[:12].view(3, 4))
        assert torch.equal(back["module"]["b.weight"], shared_vals[13:48].view(5, 7))
        assert back["module"]["a.weight"].untyped_storage().data_ptr() == (
            back["module"]["b.weight"].untyped_storage().data_ptr()
        )
        assert torch.equal(back["zeros"], torch.zeros(2, 3)) and back["scalar"].item() == 2.5
        assert back["meta"] == OrderedDict([("step", 3), ("name", "x"), ("shape", torch.Size([2, 3]))])

    ours = load_tree(path)
    for dt, values in tensors.items():
        assert ref_bytes(ours[dt]) == torch_bytes(values), dt
    assert ours["module"]["b.weight"].storage_offset == 13
    assert ours["module"]["a.weight"].storage.key == ours["module"]["b.weight"].storage.key
    with TorchZip(path) as z:
        assert all(z.data_offset(n) % 64 == 0 for n in z.entries)
        assert [n.split("/", 1)[1] for n in z.entries][:4] == [
            "data.pkl",
            ".format_version",
            ".storage_alignment",
            "byteorder",
        ]


def test_ptwriter_deepspeed_globals_read_by_our_reader(tmp_path: Path) -> None:
    """ZeroStageEnum, LossScaler and fragment_address need deepspeed for torch.load; we stand them in."""
    tree = {
        "zero_stage": pw.Reduce(pw.Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), (2,)),
        "loss_scaler": pw.Obj(
            pw.Global("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
            {"cur_scale": 256.0, "dynamic": True, "dtype": pw.Global("torch", "float16")},
        ),
        "mapping": OrderedDict(
            [
                (
                    "w",
                    pw.Obj(
                        pw.Global("deepspeed.utils.tensor_fragment", "fragment_address"),
                        {"numel": 12, "start": 30},
                    ),
                )
            ]
        ),
    }
    path = tmp_path / "optim.pt"
    pt_save(tree, path)
    ours = load_tree(path)
    assert isinstance(ours["zero_stage"], int) and ours["zero_stage"] == 2
    assert isinstance(ours["zero_stage"], ZeroStage)
    scaler = ours["loss_scaler"]
    assert isinstance(scaler, Record)
    assert scaler.get("cur_scale") == 256.0 and scaler.get("dynamic") is True
    assert repr(scaler.get("dtype")) == "float16"
    frag = ours["mapping"]["w"]
    assert (frag.numel, frag.start) == (12, 30)
    assert "fragment_address" in repr(frag)
    # the same archive is refused by torch's own safe loader (proves these globals are really in it)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


# --- error surface of the reader itself ---------------------------------------------------------------------------


def _is_storage(name: str) -> bool:
    return name.endswith("/data/0")


@pytest.mark.parametrize(
    ("compression", "edit", "match"),
    [
        # a re-zipped (deflated) archive gets a clear error rather than garbage tensors
        pytest.param(zipfile.ZIP_DEFLATED, lambda n, d: d, "compressed", id="compressed-entry"),
        # a pickle naming a storage record that the archive lacks
        pytest.param(
            zipfile.ZIP_STORED,
            lambda n, d: None if _is_storage(n) else d,
            "not in the archive",
            id="storage-record-missing",
        ),
        # a tensor whose size/stride reaches past its record: the record shrinks to 2 floats, the pickle still
        # says 4 (no out-of-bounds reads)
        pytest.param(
            zipfile.ZIP_STORED,
            lambda n, d: d[:8] if _is_storage(n) else d,
            r"should hold|past the end",
            id="view-past-end-of-storage",
        ),
    ],
)
def test_an_archive_rewritten_wrong_is_a_clear_corrupt_file_error(
    tmp_path: Path, compression: int, edit: Callable[[str, bytes], bytes | None], match: str
) -> None:
    """torch's own archive, written again entry by entry with one thing changed: a CorruptFileError saying
    what is wrong, never garbage tensors or a read past a record."""
    src = save(tmp_path, {"x": torch.ones(1000)})
    out = tmp_path / "rewritten.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", compression) as zout:
        for name in zin.namelist():
            data = edit(name, zin.read(name))
            if data is not None:
                zout.writestr(name, data)
    with pytest.raises(CorruptFileError, match=match):
        load_tree(out)


def test_unsupported_dtype_is_a_clear_error(tmp_path: Path) -> None:
    """Dtypes we cannot stand in (complex32) fail with an InspectorError, not a crash."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = save(tmp_path, {"x": torch.zeros(3, dtype=torch.complex32)})
    with pytest.raises(InspectorError):
        load_tree(path)
