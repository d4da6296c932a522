"""Past one machine with the checkpoint in a bucket: `convert s3://… OUT --part I/N` on N processes at once,
each with its own store client from the URL and the environment, then the finishing run; and a universal
checkpoint read from the bucket as input. Against moto's S3 server on localhost, behind tests/remote/proxy.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inspector.scan.json_view import checkpoint_json
from inspector.scan.scanner import scan
from tests.conftest import REPO_ROOT, run_cli
from tests.remote.conftest import SECRET, upload
from tests.remote.proxy import S3Proxy

pytestmark = pytest.mark.s3

PART_TIMEOUT = 180


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def run_parts(args: list[str], n: int) -> list[str]:
    """`convert *args --part i/n` for every i, all at once, each a fresh process in its own process group
    (killed whole on a timeout); their outputs, after asserting every one exited 0."""
    env = dict(os.environ, COLUMNS="400", NO_COLOR="1", TERM="dumb", PYTHONPATH=str(REPO_ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "inspector", "convert", *args, "--part", f"{i}/{n}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        for i in range(n)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=PART_TIMEOUT)
            assert proc.returncode == 0, out
            assert SECRET not in out
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return outputs


@pytest.mark.parametrize(
    "kind, extra", [("weights", ["--shard-size", "1MB"]), ("universal", [])], ids=["weights", "universal"]
)
def test_parts_from_a_bucket_then_the_finish_equal_one_run(
    s3_demo: tuple[str, Path], proxy: S3Proxy, tmp_path: Path, kind: str, extra: list[str]
) -> None:
    """Three parts read the bucket at once (each its own client), the finishing run reuses their files: the
    folder is byte for byte one run's from the same bucket, and (universal) the local copy's."""
    url, local = s3_demo
    args = ["--format", kind, *extra]
    one = run_cli("convert", url, tmp_path / "one", *args)
    assert one.rc == 0, one.output
    single_requests = proxy.throttle.requests
    out = tmp_path / "parts"
    run_parts([url, str(out), *args], 3)
    assert proxy.throttle.requests > single_requests  # the parts really read the bucket
    published = {"weights": "model.safetensors.index.json", "universal": "latest_universal"}[kind]
    assert not (out / published).exists()  # nothing is published by a part
    final = run_cli("convert", url, out, *args)
    assert final.rc == 0, final.output
    assert _tree(out) == _tree(tmp_path / "one")
    if kind == "universal":  # a universal export records no source paths: equal to the local copy's too
        assert run_cli("convert", local, tmp_path / "local", *args).rc == 0
        assert _tree(out) == _tree(tmp_path / "local")
    checked = run_cli("verify", url, out)
    assert checked.rc == 0, checked.output


def test_a_trainer_run_in_a_bucket_converts_in_parts_into_a_model_folder(
    s3_client: Any, demo: Any, tmp_path: Path
) -> None:
    """`--format model` (the default) from a Trainer run folder in the bucket: the parts write the shards,
    the finishing run copies config and tokenizer files out of the bucket beside them; one run's folder."""
    from tests.convert.kinds.hf import SIDE, trainer_run

    run = trainer_run(demo, tmp_path / "src")
    upload(s3_client, run, "trainer/run")
    url = "s3://ckpt/trainer/run"
    args = ["--shard-size", "200KB"]
    assert run_cli("convert", url, tmp_path / "one", *args).rc == 0
    out = tmp_path / "parts"
    run_parts([url, str(out), *args], 2)
    final = run_cli("convert", url, out, *args)
    assert final.rc == 0, final.output
    got = _tree(out)
    assert got == _tree(tmp_path / "one") and set(SIDE) <= got.keys()
    assert sum(name.endswith(".safetensors") for name in got) >= 2


@pytest.fixture(scope="session")
def s3_universal(
    s3_client: Any, s3_demo: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """(URL, local folder) of a universal checkpoint, converted from the demo on disk and uploaded."""
    _, local = s3_demo
    out = tmp_path_factory.mktemp("uni") / "uni"
    made = run_cli("convert", local, out, "--format", "universal")
    assert made.rc == 0, made.output
    upload(s3_client, out, "universal/run")
    return "s3://ckpt/universal/run", out


def test_a_universal_checkpoint_in_a_bucket_scans_like_the_local_one(s3_universal: tuple[str, Path]) -> None:
    url, local = s3_universal
    remote = json.dumps(checkpoint_json(scan(url)))
    assert '"layout": "universal"' in remote
    assert json.loads(remote.replace(url, str(local))) == checkpoint_json(scan(str(local)))
    tag = next(p.name for p in local.iterdir() if p.is_dir())
    at_tag = json.dumps(checkpoint_json(scan(f"{url}/{tag}")))  # the universal folder itself
    assert json.loads(at_tag.replace(url, str(local))) == checkpoint_json(scan(str(local / tag)))


def test_a_universal_checkpoint_in_a_bucket_converts_in_parts_and_verifies(
    s3_universal: tuple[str, Path], proxy: S3Proxy, tmp_path: Path
) -> None:
    """Universal in the bucket -> safetensors, in 2 parts plus the finish: the same tensors as converting
    the local copy (the index and headers differ only in the job fingerprint, which hashes source paths),
    verified against the bucket."""
    url, local = s3_universal
    args = ["--format", "weights", "--shard-size", "1MB"]
    out, here = tmp_path / "parts", tmp_path / "local"
    run_parts([url, str(out), *args], 2)
    final = run_cli("convert", url, out, *args)
    assert final.rc == 0, final.output
    assert run_cli("convert", local, here, *args).rc == 0
    a, b = _tree(out), _tree(here)
    assert a.keys() == b.keys() and len(a) > 2
    from safetensors.numpy import load_file

    for name in a:
        if name.endswith(".safetensors"):
            x, y = load_file(out / name), load_file(here / name)
            assert x.keys() == y.keys() and all(x[k].tobytes() == y[k].tobytes() for k in x), name
    checked = run_cli("verify", url, out)
    assert checked.rc == 0, checked.output
    pre = run_cli("preflight", url, "--json")
    assert pre.rc == 0, pre.output
    here_pre = json.loads(run_cli("preflight", local, "--json").stdout)
    assert json.loads(pre.stdout)["read_bytes"] == here_pre["read_bytes"]
