"""A run that diverged, made on purpose with real DeepSpeed (ds_diverge.py: an MLP, no gradient clipping, the
learning rate x10 after every step and inf from step 6, a tag saved after every step), read tag by tag with
`zero-inspector health --json --against <previous tag>` the way a person looking for where it went wrong
would: the tags before show the layers that moved most and the exploding exp_avg_sq, the first tag whose
masters hold NaN/Inf is an error (exit 1), the tags after it hold the same weights because DeepSpeed skips
every step whose gradients overflow, and the findings say so."""

from __future__ import annotations

import importlib.metadata
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import HERE, _free_port, _heavy_lock, _run_logged, _sha, run_inspector

pytestmark = pytest.mark.interop

STEPS, INF_AT = 8, 6


@pytest.fixture(scope="session")
def diverged(interop_cache: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The run's root (one tag per step) and ds_diverge.py's log of each step's learning rate and loss."""
    versions = "|".join(importlib.metadata.version(p) for p in ("deepspeed", "torch"))
    key = _sha((HERE / "ds_diverge.py").read_bytes(), (HERE / "ds_train.py").read_bytes(), versions)
    work = interop_cache / f"diverged-{key}"
    root, log = work / "ckpt", work / "diverge.json"
    with _heavy_lock(interop_cache):
        if not log.exists():
            work.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
            cmd += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
            cmd += [str(HERE / "ds_diverge.py"), str(root), "--steps", str(STEPS), "--inf-lr-at", str(INF_AT)]
            _run_logged(cmd, work / "build.log", "torchrun build of the diverged run")
    return root, json.loads(log.read_text())


def _health(root: Path, tag: str, against: str | None) -> tuple[int, dict[str, Any]]:
    args = ["health", str(root), "--tag", tag, "--json"] + (["--against", against] if against else [])
    proc = run_inspector(*args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _codes(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


def test_a_diverged_run_tag_by_tag(diverged: tuple[Path, list[dict[str, Any]]]) -> None:
    root, log = diverged
    tags = [e["tag"] for e in log]
    assert tags == [f"global_step{i}" for i in range(1, STEPS + 1)]
    docs = {}
    for i, tag in enumerate(tags):
        docs[tag] = _health(root, tag, tags[i - 1] if i else None)

    first_bad = tags[INF_AT - 1]  # the step that ran with lr = inf wrote Inf/NaN into the masters
    for i, tag in enumerate(tags):
        rc, doc = docs[tag]
        masters = {t["name"]: t for t in doc["tensors"] if t["source"] == "master"}
        broken = sorted(n for n, t in masters.items() if t["nan"] or t["inf"])
        errors = [f for f in doc["findings"] if f["severity"] == "error"]
        if i < INF_AT - 1:  # sound tags: exit 0, no master holds NaN/Inf
            assert rc == 0 and not broken and not errors, (tag, errors)
        else:  # from the first bad tag on: exit 1, one error per broken master, named
            assert rc == 1 and broken, tag
            assert sorted(f["tensor"] for f in errors) == broken, tag
            assert {f["code"] for f in errors} == {"nonfinite-master"}, tag
            # the first bad tag says it is the first: the tag before had none
            first = [f"none in {tags[i - 1]}" in f["message"] for f in errors]
            assert all(first) if tag == tags[INF_AT - 1] else not any(first), tag
            # the module copy is not reported again as "the fp32 master is finite"
            assert not _codes(doc, "nonfinite-module"), tag
        if i == 0:
            continue
        moved = _codes(doc, "moved-most")
        finite = [t for t in masters.values() if isinstance(t["delta_norm"], float) and t["delta_norm"] > 0]
        if i < INF_AT - 1:
            # the layers that moved most are named, largest relative change first, and they are the largest
            assert moved and all(f["tensor"] and f["message"].startswith(f["tensor"]) for f in moved), tag
            order = sorted(finite, key=lambda t: -t["delta_rel"])
            assert [f["tensor"] for f in moved] == [t["name"] for t in order[: len(moved)]], tag
        else:  # NaN changes are not "moves"
            assert not moved, (tag, moved)

    # the gradients exploded before the masters broke: exp_avg_sq grew by orders of magnitude tag on tag
    grew = [t for t in tags[1 : INF_AT - 1] if _codes(docs[t][1], "moment-grew")]
    assert grew, "no tag before the first bad one says the moments are exploding"
    for t in grew:
        for f in _codes(docs[t][1], "moment-grew"):
            row = next(
                r for r in docs[t][1]["tensors"] if (r["name"], r["source"]) == (f["tensor"], "exp_avg_sq")
            )
            assert row["norm"] / row["against_norm"] >= 1e4 and f["source"] == "exp_avg_sq", f

    # after the first bad tag the forward pass overflows, DeepSpeed skips every step, the tags repeat
    rc, first = docs[first_bad]
    assert not _codes(first, "unchanged")
    for tag, prev in zip(tags[INF_AT:], tags[INF_AT - 1 :], strict=False):
        _, doc = docs[tag]
        unchanged = _codes(doc, "unchanged")
        assert len(unchanged) == 1 and unchanged[0]["severity"] == "warning", tag
        assert f"since {prev}" in unchanged[0]["message"] and "skipped" in unchanged[0]["message"], tag
        assert all(t["delta_norm"] == 0.0 for t in doc["tensors"] if t["source"] == "master"), tag
        assert _codes(doc, "skipped-steps"), tag
        assert not math.isfinite(float(next(e for e in log if e["tag"] == tag)["loss"])), tag
