"""A bounded, seeded fuzz run over real checkpoints, in CI: the integers and names inside a rank file's pickle
(shapes, paddings, partition counts, offsets, step counters, parameter names) are rewritten in place, keeping
the pickle well formed so the mutation reaches the typed records and the layout rather than the unpickler.
Every run of scan, preflight, convert and verify must end in a clean refusal (exit 1, 2 or 3) or a correct
output: a conversion that exits 0 must verify and must load in the safetensors library. None may end in a
traceback or a hang. The outcome counts are printed (`-s`) for the record."""

from __future__ import annotations

import contextlib
import io
import os
import pickletools
import random
import shutil
import signal
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from safetensors import safe_open

from inspector.cli.main import main
from inspector.demo.writer import DemoSpec

if TYPE_CHECKING:
    from conftest import DemoCache

CASES = int(os.environ.get("ZI_FUZZ_CASES", "240"))  # CI: 240 cases, ~30 s; raise it locally
SPECS = (
    DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000),
    DemoSpec(stage=3, world_size=2, dtype="bf16", params=20_000),
)
INT_OPS = {"BININT1": 1, "BININT2": 2, "BININT": 4}


def mutable_spots(pkl: bytes) -> list[tuple[int, int, str]]:
    """(offset of the argument, its width, kind) of every int and short string argument in a pickle."""
    spots = []
    for op, arg, pos in pickletools.genops(pkl):
        if op.name in INT_OPS:
            spots.append((pos + 1, INT_OPS[op.name], "int"))
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE") and isinstance(arg, str) and arg:
            head = 2 if op.name == "SHORT_BINUNICODE" else 5
            spots.append((pos + head, len(arg.encode()), "str"))
    return spots


def pickle_span(path: Path) -> tuple[int, int]:
    """(file offset, size) of the archive's data.pkl bytes."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data.pkl"))
    with open(path, "rb") as fh:
        fh.seek(info.header_offset + 26)
        nlen, xlen = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
    return info.header_offset + 30 + nlen + xlen, info.file_size


def mutate(path: Path, rng: random.Random) -> str:
    start, size = pickle_span(path)
    raw = bytearray(path.read_bytes())
    spots = mutable_spots(bytes(raw[start : start + size]))
    where, width, kind = rng.choice(spots)
    if kind == "int":
        value = rng.choice([0, 1, 2, 3, rng.randrange(1 << (8 * width)), (1 << (8 * width)) - 1])
        raw[start + where : start + where + width] = value.to_bytes(width, "little")
    else:
        pos = start + where + rng.randrange(width)
        raw[pos] = rng.choice(b"./\\\x00\x1b.xa_0")
    path.write_bytes(bytes(raw))
    return f"{kind}@{where}"


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise TimeoutError("hang")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(*args: object) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), deadline(60):
        return main([str(a) for a in args])


def loads(out: Path) -> bool:
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), "np") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                st.get_tensor(k)
    return True


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"s{s.stage}")
def test_mutated_metadata_is_refused_or_converted_correctly(
    demo: DemoCache, tmp_path: Path, spec: DemoSpec
) -> None:
    base = demo(spec)
    tag = next(p for p in base.iterdir() if p.is_dir())
    files = sorted(p.name for p in tag.glob("*.pt"))
    rng = random.Random(20261123 + spec.stage)
    outcomes: Counter[str] = Counter()
    for case in range(CASES // len(SPECS)):
        root = tmp_path / f"c{case}"
        shutil.copytree(base, root)
        victim = root / tag.name / rng.choice(files)
        what = mutate(victim, rng)
        label = f"case {case} ({victim.name} {what})"
        rc_scan = run("scan", root, "--json")
        rc_pre = run("preflight", root, "--out", root / "out")
        rc_conv = run("convert", root, root / "out", "--force")
        assert {rc_scan, rc_pre, rc_conv} <= {0, 1, 2, 3}, label
        if rc_conv == 0:
            assert run("verify", root, root / "out") == 0, f"{label}: converted but does not verify"
            assert loads(root / "out"), label
            outcomes["converted and verified"] += 1
        else:
            outcomes[f"refused (exit {rc_conv})"] += 1
        shutil.rmtree(root)
    print(f"\nfuzz {spec.stage=}: {dict(outcomes)}")
    assert sum(outcomes.values()) == CASES // len(SPECS)
