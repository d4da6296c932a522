"""One end-to-end case per class of the input attack set, through the CLI in a fresh interpreter: each is
refused with a clear message and a non-zero exit, never a traceback or a hang, and no secret or file content
reaches the terminal. (Byte-level and record-level classes are also covered by tests/format, tests/parse and
the fuzz run; the rank proof by tests/scan.)"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from inspector.demo.writer import DemoSpec

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)
TAG = "global_step3"
MODEL = "mp_rank_00_model_states.pt"
SECRET = "ZI_TEST_SECRET_TOKEN=hunter2-do-not-print"


def clean(res: CliResult, *needles: str, rc: tuple[int, ...] = (1, 2)) -> None:
    assert "Traceback" not in res.output, res.output
    assert res.rc in rc, res.output
    assert SECRET not in res.output and "hunter2" not in res.output
    for n in needles:
        assert n in res.output, f"{n!r} not in:\n{res.output}"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secrets.env"
    path.write_text(SECRET + "\n")
    return path


@pytest.fixture
def universal(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> Path:
    root = demo.copy(SPEC, tmp_path / "ckpt")
    res = cli("convert", root, tmp_path / "uni", "--format", "universal")
    assert res.rc == 0, res.output
    return tmp_path / "uni"


# --- 1. secrets printed --------------------------------------------------------------------------------------


def test_latest_universal_linked_to_a_secret_is_never_shown(
    universal: Path, secret: Path, cli: Callable[..., CliResult], demo: DemoCache
) -> None:
    (universal / "latest_universal").unlink()
    (universal / "latest_universal").symlink_to(secret)
    clean(cli("scan", universal), "latest_universal")
    clean(cli("verify", demo(SPEC), universal), "latest_universal")


def test_latest_universal_holding_a_secret_is_never_shown(
    universal: Path, cli: Callable[..., CliResult]
) -> None:
    (universal / "latest_universal").write_text(SECRET + "\0PATH=/usr/bin\0")  # what /proc/self/environ holds
    clean(cli("scan", universal), "latest_universal")


# --- 2. links followed out of the checkpoint -----------------------------------------------------------------


def test_a_universal_input_linked_out_is_not_read(
    universal: Path, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    folder = next(p for p in universal.iterdir() if p.is_dir())
    victim = next(p for p in (folder / "zero").iterdir() if p.is_dir()) / "fp32.pt"
    elsewhere = tmp_path / "elsewhere.pt"
    shutil.move(victim, elsewhere)
    victim.symlink_to(elsewhere)
    res = cli("scan", universal)
    clean(res, "outside")


def test_trainer_side_files_linked_out_are_never_copied(
    demo: DemoCache, tmp_path: Path, secret: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}))
    (root / "special_tokens_map.json").symlink_to(secret)
    out = tmp_path / "out"
    clean(cli("convert", root, out), "special_tokens_map.json", "outside")
    assert not (out / "special_tokens_map.json").exists()
    assert not any(SECRET in p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("entry", ["../../../etc/passwd", "/etc/passwd", "pipe.safetensors"])
def test_verify_reads_only_shards_inside_the_output(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], entry: str
) -> None:
    root = demo(SPEC)
    out = tmp_path / "out"
    assert cli("convert", root, out, "--shard-size", "20KB").rc == 0
    index = out / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = next(iter(doc["weight_map"]))
    doc["weight_map"][first] = entry
    index.write_text(json.dumps(doc))
    if entry == "pipe.safetensors":
        os.mkfifo(out / entry)
    res = cli("verify", root, out, timeout=60)  # a FIFO hung verify before
    clean(res)
    assert "root:" not in res.output  # /etc/passwd's content


# --- 3. wrong output with exit 0 from bad metadata -----------------------------------------------------------


def _edit_model(root: Path, edit: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    path = root / TAG / MODEL
    sd = torch.load(path, weights_only=True)  # model states hold no DeepSpeed classes: no deepspeed import
    edit(sd)
    torch.save(sd, path)


def test_a_negative_shape_is_refused_not_converted(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Negative sizes anywhere (param_shapes here; alignment paddings and frozen shapes in tests/parse) are
    refused by the typed records: exit 0 used to write a file safetensors cannot load."""
    root = demo.copy(SPEC, tmp_path / "ckpt")

    def neg(sd: dict) -> None:  # type: ignore[type-arg]
        group = sd["param_shapes"][0]
        group[next(iter(group))] = (-4, 8)

    _edit_model(root, neg)
    clean(cli("convert", root, tmp_path / "out"), "param_shapes", rc=(1,))
    assert not (tmp_path / "out").exists()


# --- 4. cost not bounded by the input ------------------------------------------------------------------------


def test_a_stray_huge_rank_number_is_refused_at_once(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / TAG / "bf16_zero_pp_rank_1000000000_mp_rank_00_optim_states.pt").write_bytes(b"")
    clean(cli("scan", root, memory_limit=1 << 30, timeout=60), "1,000,000,000")


def test_a_huge_dp_world_size_is_refused(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    root = demo.copy(SPEC, tmp_path / "ckpt")
    _edit_model(root, lambda sd: sd.update(dp_world_size=10**9))
    clean(cli("scan", root, memory_limit=1 << 30, timeout=60), "dp_world_size", rc=(1,))


def test_a_dp_world_size_beyond_the_files_is_one_finding(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(SPEC, tmp_path / "ckpt")
    _edit_model(root, lambda sd: sd.update(dp_world_size=100_000))
    res = cli("scan", root, "--json", memory_limit=1 << 30, timeout=60)
    clean(res, rc=(1,))
    found = [f for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"]
    assert len(found) < 10 and any("dp_world_size" in f["message"] for f in found)


# --- 7. smaller ----------------------------------------------------------------------------------------------


def test_a_name_repeated_across_groups_is_refused(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(SPEC, tmp_path / "c")

    def repeat(sd: dict) -> None:  # type: ignore[type-arg]
        g0 = sd["param_shapes"][0]
        name = next(iter(g0))
        sd["param_shapes"].append({name: g0[name]})

    _edit_model(root, repeat)
    clean(cli("scan", root), "again", rc=(1,))


def test_preflight_says_a_read_only_output_does_not_fit(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.system(f"mount -t tmpfs -o ro,size=1m tmpfs {ro} 2>/dev/null") != 0:
        pytest.skip("cannot mount a read-only file system here (needs root)")
    try:
        res = cli("preflight", demo(SPEC), "--out", ro / "out", "--json")
        assert json.loads(res.stdout)["fits"] is False and res.rc == 3, res.output
        assert "read-only" in json.loads(res.stdout)["problem"]
    finally:
        os.system(f"umount {ro}")
