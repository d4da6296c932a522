"""No output carries a local path: a model is published (a hub, colleagues) with its metadata, and a path would
carry the user's folder layout, user name or host name with it. The merged base is recorded by its folder's
name and a hash of its tensors; verify finds the base again from --base or adapter_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.kinds import KINDS, Request, get, of_output
from inspector.convert.options import ConvertOptions
from inspector.convert.verify import VerifyResult
from inspector.errors import InspectorError
from inspector.scan.scanner import scan
from tests.convert.kinds.hf import SPEC, lora_checkpoint, trainer_run

PLANTED = "zi-planted-user-4f1c"  # stands for a home folder, user or host name in the paths given


def _checkpoint(kind: str, demo: Any, home: Path) -> tuple[Any, str | None]:
    """A checkpoint under `home` that `kind` is offered for, and the --base a merge is given (outside it)."""
    if kind in ("adapter", "merged"):
        ckpt = lora_checkpoint(demo, home, with_base=False)
        config = Path(ckpt.root) / "adapter_config.json"  # a hub name: the planted path is only in --base
        config.write_text(
            json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": "org/base"})
        )
        return ckpt, str(home / "base") if kind == "merged" else None
    if kind == "model":
        return scan(str(trainer_run(demo, home))), None
    return scan(str(demo.copy(SPEC, home / "ckpt"))), None


@pytest.mark.parametrize("kind", [k.name for k in KINDS])
def test_no_output_file_carries_a_local_path(demo: Any, tmp_path: Path, kind: str) -> None:
    home = tmp_path / PLANTED
    ckpt, base = _checkpoint(kind, demo, home)
    out = home / "out"
    job = get(kind).plan(ckpt, Request(ConvertOptions(dtype="bf16"), base=base), str(out))
    for _ in job.run():
        pass
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    carrying = [str(p.relative_to(out)) for p in files if PLANTED.encode() in p.read_bytes()]
    assert not carrying, carrying


def _verify(ckpt: Any, out: Path, **kw: Any) -> VerifyResult:
    kind = of_output(str(out))
    return [ev for ev in kind.verify(ckpt, str(out), **kw) if isinstance(ev, VerifyResult)][-1]


def test_a_merge_records_its_base_by_name_and_verify_finds_it_again(demo: Any, tmp_path: Path) -> None:
    from inspector.parse.safetensors import read_header
    from inspector.system.source import Source

    home = tmp_path / PLANTED
    ckpt, base = _checkpoint("merged", demo, home)
    out = home / "out"
    for _ in get("merged").plan(ckpt, Request(ConvertOptions(), base=base), str(out)).run():
        pass
    header = read_header(Source.at(str(out)), str(out / "model.safetensors"), exact=False)
    record = json.loads(header.metadata["zero_inspector"])["merged_base"]
    assert record["name"] == "base" and len(record["tensors_sha256"]) == 64
    assert _verify(ckpt, out, base=base).ok
    with pytest.raises(InspectorError, match="--base"):  # adapter_config names a hub repo: no local base
        _verify(ckpt, out)
    other = lora_checkpoint(demo, tmp_path / "other", with_base=False, fan_in_fan_out=True)  # other shapes
    with pytest.raises(InspectorError, match="not the one this model was merged into"):
        _verify(ckpt, out, base=str(Path(other.root).parent / "base"))
