"""Checkpoints saved by real DeepSpeed with pipeline, expert or tensor parallelism, committed under
tests/fixtures/layouts/<name>/ with the script that made each (see its versions.txt) and what the live engines
held at save time (expected.npz: `fp32/<name>` masters, `half/<name>` 16-bit bit patterns, `buffer/<name>`),
so the quick suite checks every layout bit for bit without DeepSpeed."""

from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.convert.verify import VerifyResult, run_verify
from inspector.scan.model import Checkpoint
from inspector.scan.scanner import scan
from inspector.scan.tp_rules import parse_rule
from tests.convert.jobs import run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"
HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
LAYOUTS = sorted(p.parent.name for p in FIXTURES.glob("*/ckpt"))
# plain data parallel, no model axis (ZeRO off, legacy serialization, Ulysses sequence parallel): named dp_* or
# spN_* (make_plain.py); the others are model-parallel layouts, whose scans carry a `Parallel`
DATA_PARALLEL = frozenset(n for n in LAYOUTS if re.fullmatch(r"dp|sp\d+", n.split("_")[0]))
MODEL_PARALLEL = [n for n in LAYOUTS if n not in DATA_PARALLEL]
# what the user must say (--tp-split) where a fixture records no tensor-parallel split: the one its script knew
TP_SPLIT: dict[str, tuple[str, ...]] = {"moe_tp_z1_bf16": ("*=replicated",)}
# ZeRO off (pipelines and native MoE): DeepSpeed cannot resume a universal checkpoint of them, so it is refused;
# pipeline + native MoE likewise (DeepSpeed's own ds_to_universal fails on it: ds_tools.txt)
NO_UNIVERSAL = frozenset(n for n in LAYOUTS if n.split("_")[1] == "z0" or n.startswith("ppmoe_"))
# the refusal's reason, in either wording (ZeRO off: "cannot resume"; pipeline + MoE: "shown to resume")
NO_UNIVERSAL_WHY = r"cannot resume|shown to resume"


def ckpt_dir(name: str) -> Path:
    return FIXTURES / name / "ckpt"


def split_args(name: str) -> list[str]:
    """The command line's `--tp-split` options a fixture needs (none where its split is recorded)."""
    return [a for rule in TP_SPLIT.get(name, ()) for a in ("--tp-split", rule)]


def split_rules(name: str) -> tuple[tuple[str, str], ...]:
    return tuple(parse_rule(r) for r in TP_SPLIT.get(name, ()))


def scan_layout(name: str, root: str | Path | None = None) -> Checkpoint:
    """A fixture scanned as a user who knows its split would (`root`: a copy of it, a URL)."""
    return scan(str(root if root is not None else ckpt_dir(name)), tp_split=split_rules(name))


def writable(name: str, dest: Path) -> Path:
    """A private copy of a fixture's checkpoint (for tests that damage files)."""
    shutil.copytree(ckpt_dir(name), dest)
    return dest


def flip_bit(path: str | Path, offset: int) -> None:
    """The lowest bit of the byte at `offset` of `path` flipped: one value damaged, the file still parses."""
    with open(path, "r+b") as f:
        f.seek(offset)
        first = f.read(1)
        f.seek(offset)
        f.write(bytes([first[0] ^ 1]))


def scan_without(name: str, tmp_path: Path, *files: str, tag: str = "global_step3") -> Checkpoint:
    """Fixture `name` copied under tmp_path, `files` removed from its tag folder, then scanned: the damage
    tests' one setup."""
    from inspector.scan.scanner import scan

    root = writable(name, tmp_path / "ck")
    for f in files:
        os.remove(root / tag / f)
    return scan(str(root))


def expected(name: str | Path) -> dict[str, np.ndarray]:
    """The live engines' values: a committed fixture's (by name) or a freshly made one's (its folder)."""
    folder = name if isinstance(name, Path) else FIXTURES / name
    with np.load(folder / "expected.npz") as z:
        return {k: z[k] for k in z.files}


def convert(ckpt: Checkpoint, out: Path, dtype: str) -> dict[str, np.ndarray]:
    """Convert with the real engine, verify the output, and return every tensor written."""
    for _ in run(build_plan(ckpt, ConvertOptions(dtype=dtype)), str(out)):
        pass
    results = [ev for ev in run_verify(ckpt, str(out)) if isinstance(ev, VerifyResult)]
    assert results and results[-1].ok, results
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(glob.glob(os.path.join(out, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors


def assert_exact(ckpt: Checkpoint, name: str | Path, tmp_path: Path) -> None:
    """fp32 output equals the live fp32 masters bit for bit; the training-dtype output equals them cast
    (torch's round to nearest even) and the live 16-bit weights; buffers are the live buffers."""
    want = expected(name)
    masters = {k[5:]: v for k, v in want.items() if k.startswith("fp32/")}
    buffers = {k[7:]: v for k, v in want.items() if k.startswith("buffer/")}
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    assert set(fp32) == set(masters) | set(buffers)
    for n, v in masters.items():
        assert fp32[n].dtype == np.float32 and np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n
    half = convert(ckpt, tmp_path / "half", "auto")
    if ckpt.compute_dtype == "float32":  # fp32 training: the native dtype is fp32, the weights the masters
        for n, v in masters.items():
            assert half[n].dtype == np.float32 and np.array_equal(
                half[n].view(np.uint32), v.view(np.uint32)
            ), n
        return
    low = HALF[ckpt.compute_dtype]
    for n, v in masters.items():
        cast = v.astype(low).view(np.uint16)
        assert np.array_equal(half[n].view(np.uint16), cast), n
        assert np.array_equal(want[f"half/{n}"], cast), n  # the live 16-bit weights are the cast masters
    for n, v in buffers.items():
        assert np.array_equal(fp32[n].astype(v.dtype), v), n
