"""scan, preflight, convert (model, --dtype fp32/fp16, universal, a PEFT adapter, a merged model) and verify
of a bf16 checkpoint import no ml_dtypes (#43): its import alone costs ~0.7 CPU-seconds, more than converting
a small model. bf16 frozen weights to an fp32 or fp16 output are cast on the bits (`cast.cast_raw`), verify
rebuilds them with its own integer arithmetic, preflight times the converter's own raw cast, a merge widens
and rounds bf16 on the bits, and a merged output's verify widens it on the bits and knows its finfo. The
subprocess pattern is tests/test_import_hygiene.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from inspector.demo.writer import DemoSpec, write_demo
from inspector.scan.scanner import scan

LORA = Path(__file__).resolve().parents[1] / "fixtures" / "trainer_lora" / "run"

_RUN = """
import contextlib, io, json, sys
from inspector.cli.main import main
ck, lora, out = sys.argv[1:4]
base = lora + "/../base"
rcs = []
for argv in (["scan", ck], ["preflight", ck, "--out", out + "/p"],
             ["convert", ck, out + "/f32", "--dtype", "fp32"], ["verify", ck, out + "/f32"],
             ["convert", ck, out + "/f16", "--dtype", "fp16"], ["verify", ck, out + "/f16"],
             ["convert", ck, out + "/bf16"], ["verify", ck, out + "/bf16"],
             ["convert", ck, out + "/u", "--format", "universal"],
             ["convert", lora, out + "/a", "--format", "adapter"], ["verify", lora, out + "/a"],
             ["convert", lora, out + "/m", "--format", "merged", "--base", base, "--dtype", "bf16"],
             ["verify", lora, out + "/m", "--base", base]):
    with contextlib.redirect_stdout(io.StringIO()):
        rcs.append(main(argv))
print(json.dumps({"rcs": rcs, "ml_dtypes": "ml_dtypes" in sys.modules}))
"""


def test_bf16_checkpoint_commands_import_no_ml_dtypes(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    write_demo(str(ck), DemoSpec(params=200_000))
    frozen = [t for t in scan(str(ck)).tensors if t.dtype == "bfloat16"]
    assert frozen, "the demo's frozen table is bf16: the casts below take it to fp32 and fp16"
    res = subprocess.run(
        [sys.executable, "-c", _RUN, str(ck), str(LORA), str(tmp_path / "out")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["rcs"] == [0] * 13, got["rcs"]  # every command ran, verify found every byte right
    assert got["ml_dtypes"] is False
    assert all((tmp_path / "out" / d).is_dir() for d in ("f16", "a", "m"))
