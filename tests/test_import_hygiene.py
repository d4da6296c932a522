"""Import boundaries, checked in a fresh interpreter: what each layer may load.

The core must not import the UI stack (scanning and converting work in scripts, tests and workers), and
nothing a user runs to scan, plan, preflight, convert or verify may import torch: it costs seconds and
hundreds of MiB (more than our whole 128 MiB budget on a CUDA build), and it is an optional extra.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE = [
    "inspector.scan.scanner",
    "inspector.convert.plan",
    "inspector.convert.executor",
    "inspector.convert.verify",
    "inspector.convert.preflight",
    "inspector.demo.writer",
    "inspector.system.limits",
    "inspector.system.rss",
    "inspector.system.units",
    "inspector.scan.summary",
    "inspector.health",
]
TORCH_FREE = [
    "inspector.scan.scanner",
    "inspector.scan.summary",
    "inspector.convert.plan",
    "inspector.convert.preflight",
    "inspector.convert.executor",
    "inspector.convert.verify",
    "inspector.convert.cast",
    "inspector.format.ptwriter",
    "inspector.demo.writer",
    "inspector.cli.main",
    "inspector.cli.convert",
    "inspector.cli.preflight",
    "inspector.health",
    "inspector.cli.health",
]


def _modules_after_import(mod: str) -> set[str]:
    code = f"import sys, {mod}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_core_imports_no_ui() -> None:
    loaded = _modules_after_import(", ".join(CORE))
    assert "inspector.convert.executor" in loaded  # the probe really imported the core
    assert not {"textual", "rich"} & loaded, f"the core pulls in {sorted({'textual', 'rich'} & loaded)}"


def test_scanning_needs_neither_torch_nor_deepspeed() -> None:
    """scan stays fast and works where deepspeed is not installed."""
    loaded = _modules_after_import("inspector.scan.scanner")
    assert "torch" not in loaded
    assert "deepspeed" not in loaded


@pytest.mark.parametrize("mod", TORCH_FREE)
def test_no_torch_on_the_user_path(mod: str) -> None:
    loaded = _modules_after_import(mod)
    assert mod in loaded
    assert "torch" not in loaded, f"{mod} imports torch"
    assert "deepspeed" not in loaded


def test_commands_run_without_torch(tmp_path: object) -> None:
    """demo, scan, preflight, convert and verify end to end in a process where `import torch` fails."""
    import pathlib

    root = pathlib.Path(str(tmp_path))
    code = f"""
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, _NoTorch())
from inspector.cli.main import main
ck, out = {str(root / "ck")!r}, {str(root / "out")!r}
for argv in (["demo", ck, "--params", "200K"], ["scan", ck], ["preflight", ck, "--out", out],
             ["convert", ck, out], ["verify", ck, out], ["convert", ck, out + "2", "--dtype", "fp16"],
             ["verify", ck, out + "2"]):
    rc = main(argv)
    assert rc == 0, (argv, rc)
print("ok", "torch" in sys.modules)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2:] == ["ok", "False"], res.stdout


def test_bf16_conversion_imports_no_ml_dtypes(tmp_path: object) -> None:
    """fp32 masters to a bf16 output (the common conversion) cast on the bits: ml_dtypes' import alone costs
    ~0.8 CPU-seconds, more than casting a 500M model, and it ran inside a worker holding the GIL."""
    import pathlib

    root = pathlib.Path(str(tmp_path))
    ck, out = str(root / "ck"), str(root / "out")
    demo = f"from inspector.cli.main import main; raise SystemExit(main(['demo', {ck!r}, '--params', '200K']))"
    subprocess.run([sys.executable, "-c", demo], capture_output=True, text=True, check=True)
    code = f"""
import sys
from inspector.cli.main import main
rc = main(["convert", {ck!r}, {out!r}, "--dtype", "bf16"])
print("rc", rc, "ml_dtypes" in sys.modules)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-3:] == ["rc", "0", "False"], res.stdout[-2000:]
    assert (root / "out").is_dir()


def test_one_dtype_table() -> None:
    """format/dtypes.py is the one dtype table (names, sizes, safetensors codes, numpy/ml_dtypes types);
    a private copy elsewhere (merge.py's NP_DTYPES, basemodel's safetensors codes, the universal writer's
    numpy map) drifts from it. A dict entry keyed by or naming a dtype, or an ml_dtypes type, is one."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "inspector"
    names = "bfloat16|float16|float32|float64|int64|int8|uint8|bool|F32|F16|BF16|I64|U8"
    key = rf'(?:^\s*|[{{,]\s*)["\'](?:{names})["\']\s*:'  # "float32": ... as a dict entry
    value = rf':\s*(?:np\.(?:float|u?int|bool)\w*|["\'](?:{names})["\'])\s*[,}}]'  # ...: np.float32, / ...: "bfloat16",
    entry = re.compile(f"{key}|{value}")
    ml = re.compile(r"ml_dtypes\.(?:bfloat16|float8)")
    found = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for p in sorted(root.rglob("*.py"))
        if p.name != "dtypes.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if entry.search(line) or ml.search(line)
    ]
    assert not found, "private dtype tables; derive them from inspector/format/dtypes.py:\n" + "\n".join(found)


def test_the_core_leaves_the_object_store_clients_to_store_urls() -> None:
    """boto3, obstore and fsspec are optional extras, each imported only when a URL of its store is read
    (tests/remote checks a whole local scan); importing the core must not load them."""
    loaded = _modules_after_import(", ".join(CORE))
    assert "inspector.system.bytesource" in loaded  # the probe really imported the byte-source seam
    client = sorted(m for m in loaded if m.split(".")[0] in ("boto3", "botocore", "obstore", "fsspec"))
    assert not client, f"the core imports a store client: {client[:3]}"
    # the one module that decides local-or-store for a root the user named is loaded; no store code is
    assert not [m for m in loaded if m.startswith("inspector.remote.") and m != "inspector.remote.roots"]
