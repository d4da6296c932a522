"""DeepSpeed's own converters, `zero_to_fp32` and `ds_to_universal`, run on every committed fixture under
tests/fixtures/layouts/, each outcome recorded beside ours: README's layouts table is written from it.

    DS_ACCELERATOR=cpu python -m tests.interop.ds_tools [NAME ...]    # from the repository root

writes tests/fixtures/layouts/ds_tools.txt, one line per fixture and tool: `exact (N of N)` when the tool exits 0
and every parameter it writes equals our fp32 output bit for bit (ours equals the live engines' masters: the
tests under tests/scan), what differs otherwise, or `fails (<its error's last line>)`. The tools run as
tests/interop runs them: `zero_to_fp32 CKPT OUT --safe_serialization`, `ds_to_universal --input_folder TAG
--output_folder OUT --num_extract_workers 1 --num_merge_workers 1`, and where that fails once more with
`--inject_missing_state` (the outcome then says so)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tests.scan.layout_cases import FIXTURES, TP_SPLIT, ckpt_dir

TOOLS = ("zero_to_fp32", "ds_to_universal")
RECORD = FIXTURES / "ds_tools.txt"
TIMEOUT = 600
SPLIT = TP_SPLIT  # what we are told (--tp-split) where the checkpoint records no split


def fixtures() -> list[str]:
    return sorted(p.parent.name for p in FIXTURES.glob("*/expected.npz"))


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _tag(name: str) -> Path:
    root = ckpt_dir(name)
    return root / (root / "latest").read_text().strip()


def run_tool(tool: str, name: str, out: Path, inject: bool = False) -> tuple[int, str]:
    """Run one tool on one fixture into `out`; (exit status, its output's last error-looking line)."""
    if tool == "zero_to_fp32":
        args = ["-m", "deepspeed.utils.zero_to_fp32", str(ckpt_dir(name)), str(out), "--safe_serialization"]
    else:
        args = ["-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(_tag(name))]
        args += ["--output_folder", str(out), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        args += ["--inject_missing_state"] if inject else []
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=_env(), timeout=TIMEOUT, check=False
    )
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or ln.startswith("Exception")]
    return proc.returncode, (errors or lines or [""])[-1]


def theirs(tool: str, out: Path) -> dict[str, np.ndarray]:
    """What the tool wrote, fp32 by parameter name."""
    import torch

    if tool == "zero_to_fp32":
        from safetensors.torch import load_file

        got: dict[str, torch.Tensor] = {}
        for f in sorted(glob.glob(str(out / "*.safetensors"))):
            got.update(load_file(f))
        return {n: t.float().numpy() for n, t in got.items()}
    written = {}
    for p in (out / "zero").rglob("fp32.pt"):
        saved = torch.load(p, weights_only=False)
        param = saved["param"] if isinstance(saved, dict) else saved  # AutoEP's expert files are bare tensors
        written[p.parent.relative_to(out / "zero").as_posix()] = param.detach().float().numpy()
    return written


def ours(name: str, out: Path) -> tuple[dict[str, np.ndarray], set[str], set[str]]:
    """Our fp32 output (verified), the names of the trainable parameters in it and of tied aliases (a second
    name of one parameter: AutoEP's `gate.gate.weight` is `router.gate.weight`)."""
    from inspector.scan.model import Kind
    from inspector.scan.scanner import scan
    from inspector.scan.tp_rules import parse_rule
    from tests.scan.layout_cases import convert

    ckpt = scan(str(ckpt_dir(name)), tp_split=tuple(parse_rule(r) for r in SPLIT.get(name, ())))
    aliases = {t.name for t in ckpt.tensors if t.alias_of is not None}
    return convert(ckpt, out, "fp32"), {t.name for t in ckpt.tensors if t.kind is Kind.TRAINABLE}, aliases


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.size == b.size and np.array_equal(a.reshape(-1).view(np.uint32), b.reshape(-1).view(np.uint32))


def compare(
    mine: dict[str, np.ndarray],
    got: dict[str, np.ndarray],
    wanted: set[str],
    aliases: frozenset[str] = frozenset(),
) -> str:
    """`exact (N of N)` when the tool wrote every parameter in `wanted` and all it wrote equals ours bit for
    bit (element by element: a tool that writes a 2-D weight flat is said so, not counted as differing)."""
    missing = sorted(wanted - set(got))
    unknown = sorted(set(got) - set(mine))
    both = sorted(set(got) & set(mine))
    differ = [n for n in both if not _same(got[n], mine[n])]
    flat = [n for n in both if n not in differ and got[n].shape != mine[n].shape]
    alias = [n for n in differ if n in aliases]
    differ = [n for n in differ if n not in aliases]
    if not (missing or unknown or differ):
        said = f"exact ({len(wanted)} of {len(wanted)})" + (f", {len(flat)} written flat" if flat else "")
        return said + (f"; the tied alias {alias[0]} differs from its master" if alias else "")
    shapes = [f"{tuple(got[n].shape)} where ours is {tuple(mine[n].shape)}" for n in differ[:1]]
    parts = [f"{len(differ)} of {len(got)} differ (e.g. {differ[0]}: {shapes[0]})"] if differ else []
    parts += [f"{len(missing)} of {len(wanted)} missing (e.g. {missing[0]})"] if missing else []
    parts += [f"{len(unknown)} names we do not write (e.g. {unknown[0]})"] if unknown else []
    return "written, but " + "; ".join(parts)


def outcome(tool: str, name: str, work: Path) -> str:
    """ds_to_universal runs plain first, then (when that fails) with --inject_missing_state, which pipelines
    need and which changes what it writes elsewhere (AutoEP's router gate: the 16-bit weight, not the master)."""
    rc, last = run_tool(tool, name, work / tool)
    flag = ""
    if rc != 0 and tool == "ds_to_universal":
        flag = " with --inject_missing_state"
        rc, retried = run_tool(tool, name, work / "injected", inject=True)
        last = last if rc != 0 else retried
    if rc != 0:
        return f"fails ({last.replace(str(FIXTURES) + os.sep, '')[:160]})"
    mine, wanted, aliases = ours(name, work / "ours")
    return (
        compare(mine, theirs(tool, work / ("injected" if flag else tool)), wanted, frozenset(aliases)) + flag
    )


def main(names: list[str]) -> None:
    rows: dict[tuple[str, str], str] = {}  # earlier outcomes, kept when only some fixtures are rerun
    for line in RECORD.read_text().splitlines() if RECORD.exists() else []:
        parts = line.split(" | ")
        if len(parts) >= 3:
            rows[(parts[0], parts[1])] = line
    for name in names or fixtures():
        for tool in TOOLS:
            with tempfile.TemporaryDirectory() as tmp:
                got = outcome(tool, name, Path(tmp))
            rows[(name, tool)] = f"{name} | {tool} | {got}"
            print(rows[(name, tool)], flush=True)
    import deepspeed

    head = f"# DeepSpeed {deepspeed.__version__}'s tools on these fixtures (written by tests/interop/ds_tools.py)\n"
    RECORD.write_text(head + "".join(f"{rows[k]}\n" for k in sorted(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
