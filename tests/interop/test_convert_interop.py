"""The converter CLI against real DeepSpeed: HF-style safetensors whose every tensor is DeepSpeed's, rounded.

Contract under test:
    python -m inspector convert ROOT OUTDIR --dtype {fp32,bf16,fp16} [--shard-size 1MB] [--include GLOB]
        [--exclude GLOB] [--strip-prefix P] [--exclude-frozen] [--dedupe-tied] [--overwrite]
    python -m inspector verify ROOT OUTDIR
    python -m inspector demo DIR --stage 3 --params N
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

pytestmark = pytest.mark.interop

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
FINISHED_RE = re.compile(
    r"^(model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json)$"
)
TEMP_RE = re.compile(r"(^\.|\.(tmp|part|partial|incomplete)$|~$)")
REPO_ROOT = Path(__file__).resolve().parents[2]
HF_FORMATS = ("pt", "tf", "flax", "mlx")  # transformers refuses safetensors whose metadata format is not one


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (stricter than torch.equal: -0.0 != 0.0, NaN payloads count)."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


@dataclass(frozen=True)
class Output:
    """What a converter run left in OUTDIR, loaded the way an HF loader would."""

    files: tuple[str, ...]
    tensors: dict[str, torch.Tensor]
    where: dict[str, str]  # tensor name -> file
    metadata: dict[str, dict[str, str]]  # file -> safetensors header metadata
    index: dict[str, Any] | None


def load_output(outdir: Path) -> Output:
    """Load `model.safetensors` or the shards named by `model.safetensors.index.json`, checking the layout."""
    files = tuple(sorted(os.listdir(outdir)))
    index_path = outdir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    if index is None:
        assert "model.safetensors" in files, files
        assert not [f for f in files if SHARD_RE.match(f)], files
        shard_files = ["model.safetensors"]
    else:
        assert "model.safetensors" not in files, "both a single file and an index"
        shard_files = sorted(set(index["weight_map"].values()))
        on_disk = sorted(f for f in files if SHARD_RE.match(f))
        assert shard_files == on_disk, (shard_files, on_disk)
        counts = {int(SHARD_RE.match(f).group(2)) for f in on_disk}  # type: ignore[union-attr]
        assert counts == {len(on_disk)}, on_disk
        assert [int(SHARD_RE.match(f).group(1)) for f in on_disk] == list(range(1, len(on_disk) + 1))  # type: ignore[union-attr]
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, str] = {}
    metadata: dict[str, dict[str, str]] = {}
    for fname in shard_files:
        with safe_open(str(outdir / fname), framework="pt") as fh:
            metadata[fname] = dict(fh.metadata() or {})
            for name in fh.keys():  # noqa: SIM118 -- safe_open is not a mapping
                assert name not in tensors, f"{name} in {where.get(name)} and {fname}"
                tensors[name] = fh.get_tensor(name)
                where[name] = fname
    if index is not None:
        assert index["weight_map"] == where
    return Output(files, tensors, where, metadata, index)


def check_hf_layout(out: Output) -> None:
    """What HF loaders rely on: metadata format 'pt', index total_size equal to the bytes of all tensors."""
    for fname, meta in out.metadata.items():
        assert meta.get("format") in HF_FORMATS, f"{fname}: metadata {meta}"
    if out.index is not None:
        total = out.index["metadata"]["total_size"]
        assert isinstance(total, int)
        assert total == sum(t.numel() * t.element_size() for t in out.tensors.values())


def expected(ref: Any, name: str, dtype: torch.dtype) -> torch.Tensor:
    """DeepSpeed's tensor cast like zero_to_torch does: floating to the output dtype, integers untouched."""
    t = ref.tensors[name]
    return t.to(dtype) if t.is_floating_point() else t


@pytest.fixture(scope="session")
def convert(
    tmp_path_factory: pytest.TempPathFactory,
    ds_checkpoint: Callable,
    inspector_cli: Callable,
    _command_probe: Callable,
) -> Callable[..., Path]:
    """(config, dtype, *extra args) -> OUTDIR of a successful convert; memoised: outputs are read-only."""
    done: dict[tuple[str, ...], Path] = {}

    def run(config: str, dtype: str, *extra: str) -> Path:
        _command_probe("convert")
        key = (config, dtype, *extra)
        if key not in done:
            out = tmp_path_factory.mktemp(f"convert-{config}-{dtype}") / "out"
            root = str(ds_checkpoint(config).root)
            proc = inspector_cli("convert", root, str(out), "--dtype", dtype, *extra)
            assert proc.returncode == 0, (
                f"convert {key} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            )
            done[key] = out
        return done[key]

    return run


def test_convert_bf16_matches_deepspeed(config: str, convert: Callable, reference: Callable) -> None:
    """Every config: every tensor equals DeepSpeed's reconstruction rounded to bf16, bit for bit."""
    _check_convert(config, "bf16", convert, reference)


@pytest.mark.configs("s1_bf16", "s2_fp16", "s3_bf16_ws3", "bf16_optimizer")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_convert_other_dtypes(config: str, dtype: str, convert: Callable, reference: Callable) -> None:
    """fp32 (the masters unchanged) and fp16 on a subset: each CLI run costs ~3 s of torch import here."""
    _check_convert(config, dtype, convert, reference)


def _check_convert(config: str, dtype: str, convert: Callable, reference: Callable) -> None:
    ref = reference(config)
    out = load_output(convert(config, dtype))
    check_hf_layout(out)
    assert set(out.tensors) == set(ref.tensors)  # tied aliases under both names, stage-1 frozen included
    for name, got in out.tensors.items():
        want = expected(ref, name, DTYPES[dtype])
        assert got.dtype == want.dtype, name
        assert same_bits(got, want), f"{name} ({ref.kinds[name]}, from {ref.sources[name]}) differs"
    for alias, owner in ref.aliases.items():
        assert same_bits(out.tensors[alias], out.tensors[owner])


MODULE_SOURCE_CONFIGS = (
    "s1_bf16",
    "s2_bf16",
    "s1_fp16",
    "s2_fp16",
    "s1_bf16_ws3",
    "s2_bf16_ws3",
    "bf16_optimizer",
    "s2_round_robin",
    "s2_align_round_robin",
    "s2_fp16_overflow",
    "s1_fp16_overflow_accum",
    "s2_bf16_accum",
)


@pytest.mark.configs(*MODULE_SOURCE_CONFIGS)
def test_module_source_equals_masters(
    config: str, convert: Callable, reference: Callable, ds_checkpoint: Callable, inspector_cli: Callable
) -> None:
    """`--source module` (the 16-bit module copy, half the bytes, no cast) gives DeepSpeed's tensors bit for
    bit in the training dtype, and `verify` passes it against either source."""
    ref = reference(config)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[ref.compute_dtype]
    outdir = convert(config, dtype, "--source", "module")
    out = load_output(outdir)
    assert set(out.tensors) == set(ref.tensors)
    for name, got in out.tensors.items():
        assert same_bits(got, expected(ref, name, DTYPES[dtype])), f"{name} ({ref.kinds[name]}) differs"
    root = str(ds_checkpoint(config).root)
    for against in ("module", "masters"):
        proc = inspector_cli("verify", root, str(outdir), "--against", against)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pre = inspector_cli("preflight", root, "--dtype", dtype, "--json")
    assert pre.returncode == 0, pre.stderr
    by = json.loads(pre.stdout)["read_bytes_by_source"]
    assert by["module"] < by["masters"]


@pytest.mark.configs("s2_bf16", "s3_bf16_ws3", "bf16_optimizer")
def test_sharded_index(config: str, convert: Callable, reference: Callable) -> None:
    """A small --shard-size gives numbered shards plus an index HF loaders accept, with the same tensors."""
    ref = reference(config)
    outdir = convert(config, "fp32", "--shard-size", "4KB")
    out = load_output(outdir)
    assert out.index is not None, f"no index for a ~10 KB model with 4KB shards: {out.files}"
    check_hf_layout(out)
    assert len(set(out.where.values())) > 1
    assert set(out.index["weight_map"]) == set(ref.tensors)
    for fname in set(out.where.values()):
        names = [n for n, f in out.where.items() if f == fname]
        size = sum(out.tensors[n].numel() * out.tensors[n].element_size() for n in names)
        assert size <= 4096 or len(names) == 1, f"{fname}: {size} bytes in {len(names)} tensors"
    for name, got in out.tensors.items():
        assert same_bits(got, expected(ref, name, torch.float32)), name


@pytest.mark.configs("s2_bf16")
def test_large_shard_size_gives_single_file(config: str, convert: Callable) -> None:
    out = load_output(convert(config, "bf16", "--shard-size", "1MB"))
    assert out.index is None and out.files == ("model.safetensors",)


@pytest.mark.configs("s2_bf16")
def test_include_exclude_strip(config: str, convert: Callable, reference: Callable) -> None:
    """Name selection uses globs on the checkpoint's names; --strip-prefix renames only names that have it."""
    ref = reference(config)
    f32 = torch.float32
    inc = load_output(convert(config, "fp32", "--include", "l1.*")).tensors
    assert set(inc) == {"l1.weight", "l1.bias"}
    exc = load_output(convert(config, "fp32", "--exclude", "*.bias")).tensors
    assert set(exc) == {n for n in ref.tensors if not n.endswith(".bias")}
    strip = load_output(convert(config, "fp32", "--strip-prefix", "l1.")).tensors
    renamed = {n.removeprefix("l1."): n for n in ref.tensors}
    assert set(strip) == set(renamed)
    for new, old in renamed.items():
        assert same_bits(strip[new], expected(ref, old, f32)), new


@pytest.mark.configs("s1_bf16", "s2_bf16", "s3_bf16")
def test_exclude_frozen(config: str, convert: Callable, reference: Callable) -> None:
    ref = reference(config)
    got = load_output(convert(config, "bf16", "--exclude-frozen")).tensors
    assert set(got) == {n for n, k in ref.kinds.items() if k != "frozen"}


@pytest.mark.configs("s2_bf16", "s3_bf16", "bf16_optimizer")
def test_dedupe_tied(config: str, convert: Callable, reference: Callable) -> None:
    """--dedupe-tied writes each alias once (under its owner) and records the alias in the header metadata."""
    ref = reference(config)
    out = load_output(convert(config, "bf16", "--dedupe-tied"))
    assert set(out.tensors) == {n for n in ref.tensors if n not in ref.aliases}
    meta_text = json.dumps(out.metadata)
    for alias, owner in ref.aliases.items():
        assert alias in meta_text and owner in meta_text, out.metadata
        assert same_bits(out.tensors[owner], expected(ref, owner, torch.bfloat16))


@pytest.mark.configs("s2_fp16", "s3_fp16")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_matches_zero_to_torch(config: str, dtype: str, convert: Callable, zero_to_torch: Callable) -> None:
    """Same values as the checkpoint's own zero_to_torch.py (untied configs: it cannot save tied ones)."""
    theirs = load_output(zero_to_torch(config, dtype))
    ours = load_output(convert(config, dtype))
    common = set(ours.tensors) & set(theirs.tensors)
    assert common == set(theirs.tensors) == set(ours.tensors)
    for name in sorted(common):
        assert same_bits(ours.tensors[name], theirs.tensors[name]), name


def _flip_data_byte(path: Path) -> None:
    """Flip one bit in the middle of a safetensors file's tensor data (past the JSON header)."""
    with open(path, "r+b") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        start = 8 + header_len
        size = path.stat().st_size - start
        assert size > 0
        pos = start + size // 2
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ 0x01]))


@pytest.mark.configs("s2_bf16", "s3_bf16_ws3")
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_verify_detects_flipped_byte(
    config: str,
    sharded: bool,
    convert: Callable,
    ds_checkpoint: Callable,
    inspector_cli: Callable,
    require_command: Callable,
    tmp_path: Path,
) -> None:
    require_command("verify")
    extra = ("--shard-size", "4KB") if sharded else ()
    outdir = tmp_path / "out"
    shutil.copytree(convert(config, "bf16", *extra), outdir)
    root = str(ds_checkpoint(config).root)
    ok = inspector_cli("verify", root, str(outdir))
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    target = max(f for f in os.listdir(outdir) if f.endswith(".safetensors"))
    _flip_data_byte(outdir / target)
    bad = inspector_cli("verify", root, str(outdir))
    assert bad.returncode != 0, f"verify missed a flipped byte in {target}:\n{bad.stdout[-2000:]}"


@pytest.mark.configs("s2_bf16")
def test_overwrite(
    config: str, ds_checkpoint: Callable, inspector_cli: Callable, require_command: Callable, tmp_path: Path
) -> None:
    """An existing output is left alone without --overwrite, and replaced with it."""
    require_command("convert")
    root, out = str(ds_checkpoint(config).root), tmp_path / "out"
    first = inspector_cli("convert", root, str(out), "--dtype", "bf16")
    assert first.returncode == 0, first.stderr[-3000:]
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    again = inspector_cli("convert", root, str(out), "--dtype", "fp32")
    assert again.returncode != 0, "convert overwrote an existing output without --overwrite"
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    forced = inspector_cli("convert", root, str(out), "--dtype", "fp32", "--overwrite")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert all(t.dtype in (torch.float32, torch.int64) for t in load_output(out).tensors.values())


# -- crash safety ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_demo(
    tmp_path_factory: pytest.TempPathFactory, _command_probe: Callable, inspector_cli: Callable
) -> Iterator[Path]:
    """A ~200M-parameter stage-3 demo checkpoint, big enough that convert runs for seconds; removed after."""
    _command_probe("demo")
    _command_probe("convert")
    _command_probe("verify")
    base = tmp_path_factory.mktemp("big_demo")
    root = base / "ckpt"
    proc = inspector_cli("demo", str(root), "--stage", "3", "--params", "200000000", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield root
    shutil.rmtree(base, ignore_errors=True)


def _env() -> dict[str, str]:
    """This process's environment with the repo under test importable."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, COLUMNS="400", NO_COLOR="1", TERM="dumb")


def test_sigkill_mid_convert_leaves_no_finished_files(
    big_demo: Path, tmp_path: Path, inspector_cli: Callable
) -> None:
    """A killed convert must not leave anything an HF loader would take for a finished output.

    The kill comes 0.1 s after the first output file appears, not at a fixed time after start: start-up
    varies with the machine, and the torch-free converter writes the whole demo in about a second.
    """
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "inspector",
        "convert",
        str(big_demo),
        str(out),
        "--dtype",
        "bf16",
        "--shard-size",
        "100MB",
    ]
    with open(tmp_path / "convert.log", "wb") as log:  # a file, not a pipe nobody drains
        proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline and proc.poll() is None and not (out.exists() and os.listdir(out))
            ):
                time.sleep(0.02)
            at_start = sorted(os.listdir(out)) if out.exists() else []
            time.sleep(0.1)
            still_running = proc.poll() is None
            at_kill = sorted(os.listdir(out)) if out.exists() else []
            if still_running:
                os.killpg(proc.pid, signal.SIGKILL)  # our own new session: the convert and its children
        finally:
            proc.wait(timeout=60)
    log_tail = (tmp_path / "convert.log").read_text(errors="replace")[-2000:]
    assert at_start, f"convert wrote nothing (exit {proc.returncode}):\n{log_tail}"
    assert still_running, f"convert finished within 0.1 s of writing ({at_kill}); the demo needs to be bigger"
    left = sorted(os.listdir(out)) if out.exists() else []
    assert not [f for f in left if FINISHED_RE.match(f)], f"finished-looking files after SIGKILL: {left}"

    rerun = inspector_cli(
        "convert", str(big_demo), str(out), "--dtype", "bf16", "--shard-size", "100MB", timeout=900
    )
    assert rerun.returncode == 0, f"re-running convert after a crash failed:\n{rerun.stderr[-3000:]}"
    files = sorted(os.listdir(out))
    assert "model.safetensors.index.json" in files, files
    assert not [f for f in files if TEMP_RE.search(f)], f"temporary files left behind: {files}"
    verify = inspector_cli("verify", str(big_demo), str(out), timeout=900)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
