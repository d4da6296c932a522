"""An output folder holding another conversion's partial shards (another plan: another shard count) is not
published with them: refused, naming them, and with --overwrite removed when this output is published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspector.demo.writer import DemoSpec

SPEC = DemoSpec(params=200_000)


def test_another_jobs_partial_shards_are_refused_then_removed_with_overwrite(
    demo: Any, cli: Any, tmp_path: Path
) -> None:
    ckpt = demo(SPEC)
    out = tmp_path / "out"
    out.mkdir()
    stray = out / "model-00004-of-00007.safetensors.partial"
    stray.write_bytes(b"another job's bytes")
    refused = cli("convert", ckpt, out, "--shard-size", "300KB")
    assert refused.rc != 0, refused.output
    assert stray.name in refused.output
    assert stray.exists() and not any(out.glob("*.safetensors"))
    done = cli("convert", ckpt, out, "--shard-size", "300KB", "--overwrite")
    assert done.rc == 0, done.output
    assert not stray.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in out.glob("model*")
    )
