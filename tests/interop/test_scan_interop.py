"""inspector's scanner and reader against real DeepSpeed: every name, shape, kind and byte must agree.

The truth is DeepSpeed's own reconstruction (zero_to_fp32; the module copy for stage-1 frozen params;
ds_to_universal for BF16_Optimizer), built by ds_reference.py in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.interop

REPO_ROOT = Path(__file__).resolve().parents[2]
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "float64": 8, "int32": 4, "bool": 1}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (stricter than torch.equal: -0.0 != 0.0, NaN payloads count)."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def _scan(config: str, ds_checkpoint: Callable, inspector_api: Any) -> Any:
    scan, _ = inspector_api
    return scan(str(ds_checkpoint(config).root))


def expected_dtype(ref: Any, name: str) -> str:
    """Source dtype: fp32 master for trainable/tied, compute dtype for frozen, stored dtype for buffers."""
    kind = ref.kinds[name]
    if kind == "tied":
        return expected_dtype(ref, ref.aliases[name])
    if kind == "trainable":
        return "float32"
    if kind == "buffer":
        return str(ref.module[name].dtype).removeprefix("torch.")
    return str(ref.compute_dtype).removeprefix("torch.")


def test_scan_metadata(config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any) -> None:
    ckpt, ref = _scan(config, ds_checkpoint, inspector_api), reference(config)
    assert ckpt.stage == ref.stage
    assert ckpt.world_size == ref.world_size
    assert ckpt.tag == ref.tag
    assert ckpt.deepspeed_version == ref.ds_version
    errors = [f.message for f in ckpt.findings if str(f.severity) == "error"]
    assert not errors, errors


def test_names_kinds_shapes_dtypes(
    config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any
) -> None:
    """Same name set as DeepSpeed (plus the stage-1 frozen params zero_to_fp32 drops), same metadata."""
    ckpt, ref = _scan(config, ds_checkpoint, inspector_api), reference(config)
    infos = {t.name: t for t in ckpt.tensors}
    assert len(infos) == len(ckpt.tensors), "duplicate tensor names"
    assert set(infos) == set(ref.tensors)
    for name, info in infos.items():
        want = ref.tensors[name]
        assert info.shape == tuple(want.shape), name
        assert isinstance(info.shape, tuple) and all(type(d) is int for d in info.shape), name
        assert info.numel == math.prod(want.shape), name
        assert str(info.kind) == ref.kinds[name], name
        assert info.alias_of == ref.aliases.get(name), name
        assert info.dtype == expected_dtype(ref, name), name


def test_read_tensor_matches_deepspeed(
    config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any
) -> None:
    """Every tensor, in its source dtype, equals DeepSpeed's reconstruction bit for bit."""
    _, read_tensor = inspector_api
    ckpt, ref = _scan(config, ds_checkpoint, inspector_api), reference(config)
    for info in ckpt.tensors:
        got = read_tensor(ckpt, info.name)
        want = ref.tensors[info.name]
        assert isinstance(got, torch.Tensor), info.name
        assert got.dtype == getattr(torch, info.dtype), info.name
        assert tuple(got.shape) == info.shape, info.name
        assert same_bits(got.to(want.dtype), want), f"{info.name} ({ref.sources[info.name]}) differs"
        if info.kind in ("frozen", "buffer"):  # exact stored bytes, not just after upcasting
            stored = ref.module.get(info.name)
            if stored is not None and stored.numel():
                assert same_bits(got, stored), info.name


def test_tied_aliases(config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any) -> None:
    """An alias is kind 'tied', points at its owner and reads the owner's fp32 master bytes."""
    _, read_tensor = inspector_api
    ckpt, ref = _scan(config, ds_checkpoint, inspector_api), reference(config)
    if not ref.aliases:
        pytest.skip("no tied parameters in this config")
    infos = {t.name: t for t in ckpt.tensors}
    for alias, owner in ref.aliases.items():
        assert str(infos[alias].kind) == "tied"
        assert infos[alias].alias_of == owner
        assert str(infos[owner].kind) == "trainable"
        assert same_bits(read_tensor(ckpt, alias), read_tensor(ckpt, owner))


@pytest.mark.configs("s1_bf16", "s1_bf16_ws3", "bf16_optimizer")
def test_stage1_frozen_from_module(
    config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any
) -> None:
    """FORMAT.md 3.3: zero_to_fp32 drops stage-1 frozen params; we must not, and they equal `module`."""
    _, read_tensor = inspector_api
    ckpt, ref = _scan(config, ds_checkpoint, inspector_api), reference(config)
    frozen = [n for n, k in ref.kinds.items() if k == "frozen"]
    assert frozen
    names = {t.name: t for t in ckpt.tensors}
    for name in frozen:
        assert str(names[name].kind) == "frozen"
        assert same_bits(read_tensor(ckpt, name), ref.module[name]), name


@pytest.mark.configs("s2_bf16", "s3_bf16")
def test_explicit_tag(config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any) -> None:
    scan, _ = inspector_api
    ckpt = scan(str(ds_checkpoint(config).root), tag=reference(config).tag)
    assert ckpt.tag == reference(config).tag
    assert {t.name for t in ckpt.tensors} == set(reference(config).tensors)


def test_cli_scan_json(
    config: str,
    ds_checkpoint: Callable,
    reference: Callable,
    inspector_cli: Callable,
    require_command: Callable,
) -> None:
    """`python -m inspector scan ROOT --json` prints one JSON object describing the same tensors."""
    require_command("scan")
    ref = reference(config)
    proc = inspector_cli("scan", str(ds_checkpoint(config).root), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    missing = {
        "stage",
        "world_size",
        "tag",
        "tags",
        "deepspeed_version",
        "tensors",
        "ranks",
        "findings",
    } - set(doc)
    assert not missing, missing
    assert doc["stage"] == ref.stage
    assert doc["world_size"] == ref.world_size
    assert doc["tag"] == ref.tag and ref.tag in doc["tags"]
    assert doc["deepspeed_version"] == ref.ds_version
    assert len(doc["ranks"]) == ref.world_size
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert len(tensors) == len(doc["tensors"])
    assert set(tensors) == set(ref.tensors)
    for name, t in tensors.items():
        assert tuple(t["shape"]) == tuple(ref.tensors[name].shape), name
        assert t["numel"] == math.prod(t["shape"]), name
        assert t["kind"] == ref.kinds[name], name
        assert t["dtype"] == expected_dtype(ref, name), name
        assert t["bytes"] == t["numel"] * ITEMSIZE[t["dtype"]], name
    assert not [f for f in doc["findings"] if f.get("severity") == "error"]


_NO_DEEPSPEED = textwrap.dedent("""
    import hashlib, importlib.abc, json, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("deepspeed", "torch"):
                raise ImportError(f"interop test blocks {name}")
            return None

    sys.meta_path.insert(0, Block())
    import numpy as np
    from inspector.scan.scanner import scan
    from inspector.convert.reader import read_tensor
    from inspector.format.dtypes import FLOATING

    ckpt = scan(sys.argv[1])
    out = {}
    for info in ckpt.tensors:
        t = read_tensor(ckpt, info.name)
        name = str(t.dtype)
        wide = t.astype(np.float64) if name in FLOATING else t
        out[info.name] = [f"torch.{name}", list(t.shape),
                          hashlib.sha256(np.ascontiguousarray(wide).reshape(-1).tobytes()).hexdigest()]
    assert not [m for m in sys.modules if m.split(".")[0] in ("deepspeed", "torch")]
    print(json.dumps(out))
""")


def _digest(t: torch.Tensor) -> str:
    """Same digest as the subprocess: values widened to float64 (exact for fp32/bf16/fp16)."""
    t = t.detach()
    wide = t.double() if t.is_floating_point() else t
    return hashlib.sha256(wide.contiguous().reshape(-1).numpy().tobytes()).hexdigest()


@pytest.mark.configs("s1_bf16", "s2_bf16", "s3_bf16", "bf16_optimizer")
def test_works_without_deepspeed(
    config: str, ds_checkpoint: Callable, reference: Callable, inspector_api: Any
) -> None:
    """Scan and read in a process where `import deepspeed` and `import torch` fail: the reader needs neither."""
    ref = reference(config)
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _NO_DEEPSPEED, str(ds_checkpoint(config).root)],
        check=False,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got) == set(ref.tensors)
    for name, (dtype, shape, digest) in got.items():
        assert dtype == f"torch.{expected_dtype(ref, name)}", name
        assert shape == list(ref.tensors[name].shape), name
        assert digest == _digest(ref.tensors[name]), name
