"""Issue 9 on demo checkpoints: module-copy source, kernel copies, verify's independence and its contract.

The demo's module copy is its masters rounded by construction; the proof that real DeepSpeed runs keep it
so lives in tests/interop (test_master_rounds_to_module, test_module_source_equals_masters).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import inspector.convert.pipeline as pipeline
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import SINGLE_NAME, build_plan
from inspector.convert.verify import VerifyResult, run_verify
from inspector.demo.writer import DemoSpec
from inspector.errors import CancelledError
from inspector.scan.scanner import scan
from tests.convert.jobs import execute

if TYPE_CHECKING:
    from conftest import DemoCache


S2 = DemoSpec(stage=2, world_size=2, dtype="bf16", params=120_000)
S1_FP16 = DemoSpec(stage=1, world_size=3, dtype="fp16", params=120_000)
S3 = DemoSpec(stage=3, world_size=2, dtype="bf16", params=120_000)


def read_header(path: str) -> tuple[dict[str, Any], int]:
    """The raw JSON header and where data starts, read independently of the tool's own parser."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), 8 + n


def tensors(out: Path) -> dict[str, bytes]:
    header, base = read_header(str(out / SINGLE_NAME))
    raw = (out / SINGLE_NAME).read_bytes()
    return {
        k: raw[base + v["data_offsets"][0] : base + v["data_offsets"][1]]
        for k, v in header.items()
        if k != "__metadata__"
    }


def verify(root: Path, out: Path, **kw: object) -> VerifyResult:
    *_, res = run_verify(scan(str(root)), str(out), **kw)  # type: ignore[arg-type]
    assert isinstance(res, VerifyResult)
    return res


@pytest.mark.parametrize("spec", [S2, S1_FP16], ids=["s2-bf16", "s1-fp16"])
def test_module_source_reads_half_and_writes_the_same(
    demo: DemoCache, tmp_path: Path, spec: DemoSpec
) -> None:
    root = demo(spec)
    ckpt = scan(str(root))
    masters = build_plan(ckpt, ConvertOptions())
    module = build_plan(ckpt, ConvertOptions(source="module"))
    assert masters.read_bytes_by_source == module.read_bytes_by_source
    from inspector.scan.summary import read_bytes_by_source

    # scan says what a preflight that reads each stored tensor once says (the tied alias is its owner's bytes)
    once = build_plan(ckpt, ConvertOptions(dedupe_tied=True)).read_bytes_by_source
    assert read_bytes_by_source(ckpt) == once
    by = masters.read_bytes_by_source
    assert module.read_bytes == by["module"] < by["masters"] == masters.read_bytes
    trainable = [t for s in module.shards for t in s.tensors if t.kind.value in ("trainable", "tied")]
    assert trainable and all(t.src_dtype == t.out_dtype for t in trainable)  # no cast: a kernel copy
    execute(masters, str(tmp_path / "m"))
    execute(module, str(tmp_path / "c"))
    assert tensors(tmp_path / "m") == tensors(tmp_path / "c")
    meta = json.loads(read_header(str(tmp_path / "c" / SINGLE_NAME))[0]["__metadata__"]["zero_inspector"])
    assert meta["source"] == "module"
    for against in (None, "masters", "module"):
        res = verify(root, tmp_path / "c", against=against)
        assert res.ok, res
    assert any(
        "Checked against the masters" in n for n in verify(root, tmp_path / "c", against="masters").notes
    )


def test_module_source_falls_back_where_there_is_no_copy(demo: DemoCache) -> None:
    """Stage 3 keeps empty placeholders, and fp32 output is not the copy's dtype: both read the masters."""
    s3 = build_plan(scan(str(demo(S3))), ConvertOptions(source="module"))
    assert s3.read_bytes == s3.read_bytes_by_source["masters"] == s3.read_bytes_by_source["module"]
    f32 = build_plan(scan(str(demo(S2))), ConvertOptions(source="module", dtype="fp32"))
    assert f32.read_bytes == f32.read_bytes_by_source["masters"]


def test_kernel_copy_and_buffered_copy_agree(
    demo: DemoCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = build_plan(scan(str(demo(S2))), ConvertOptions(dtype="fp32", chunk_elems=1000))
    calls = []
    real = pipeline._KernelCopy.copy

    def counting(self: pipeline._KernelCopy, *a: int) -> bool:
        calls.append(a)
        return real(self, *a)

    monkeypatch.setattr(pipeline._KernelCopy, "copy", counting)
    execute(plan, str(tmp_path / "k"))
    assert calls, "fp32 -> fp32 did not use copy_file_range"
    monkeypatch.setenv("ZI_NO_COPY_FILE_RANGE", "1")
    execute(plan, str(tmp_path / "b"))
    assert (tmp_path / "k" / SINGLE_NAME).read_bytes() == (tmp_path / "b" / SINGLE_NAME).read_bytes()


def test_kernel_copy_refused_falls_back(
    demo: DemoCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXDEV (across file systems on newer kernels) switches to pread/pwrite for the rest of the run."""
    import errno
    import os

    def refuse(*a: int) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    root = demo(S2)
    plan = build_plan(scan(str(root)), ConvertOptions(dtype="fp32"))
    execute(plan, str(tmp_path / "o"))
    assert verify(root, tmp_path / "o").ok


def test_verify_catches_a_flipped_bit(demo: DemoCache, tmp_path: Path) -> None:
    root = demo(S2)
    out = tmp_path / "o"
    execute(build_plan(scan(str(root)), ConvertOptions()), str(out))
    header, base = read_header(str(out / SINGLE_NAME))
    name = next(k for k in header if k != "__metadata__" and "mlp" in k)
    pos = base + header[name]["data_offsets"][0] + 7
    data = bytearray((out / SINGLE_NAME).read_bytes())
    data[pos] ^= 0x01
    (out / SINGLE_NAME).write_bytes(bytes(data))
    res = verify(root, out)
    assert res.mismatched == [name]


def test_verify_names_an_unreadable_source_file(demo: DemoCache, tmp_path: Path) -> None:
    """A truncated rank file: verify says which file, instead of listing tensors as unexpected."""
    root = demo.copy(S2, tmp_path / "ck")
    out = tmp_path / "o"
    execute(build_plan(scan(str(root)), ConvertOptions()), str(out))
    victim = sorted((root / "global_step3").glob("*optim_states.pt"))[0]
    with open(victim, "r+b") as fh:
        fh.truncate(4096)
    res = verify(root, out)
    assert not res.ok
    assert not res.unexpected, res.unexpected
    assert any(str(victim) in u for u in res.unreadable), res.unreadable


def test_verify_cancel_raises_like_the_converter(demo: DemoCache, tmp_path: Path) -> None:
    root = demo(S2)
    out = tmp_path / "o"
    execute(build_plan(scan(str(root)), ConvertOptions()), str(out))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CancelledError):
        for _ in run_verify(scan(str(root)), str(out), cancel=cancel):
            pass


def test_verify_reads_in_small_pieces(demo: DemoCache, tmp_path: Path) -> None:
    """Its own walk, at any piece size, agrees (pieces cut across segments and ranks)."""
    root = demo(S3)
    out = tmp_path / "o"
    execute(build_plan(scan(str(root)), ConvertOptions(dtype="fp16")), str(out))
    for piece in (1, 333, 1 << 20):
        assert verify(root, out, chunk_elems=piece).ok


def test_expected_bytes_routes() -> None:
    """verify's integer casts equal the converter's numpy casts (each is also held against torch)."""
    from inspector.convert.cast import cast_into
    from inspector.convert.verify import expected_bytes
    from inspector.format.dtypes import numpy_dtype

    rng = np.random.default_rng(5)
    src = rng.integers(0, 1 << 32, 100_003, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for out in ("bfloat16", "float16"):
        mine = np.empty(src.shape[0], numpy_dtype(out))
        cast_into(src, mine)
        assert np.array_equal(expected_bytes(src, "float32", out), mine.view(np.uint8))
