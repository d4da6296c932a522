"""Every file in a tag folder accounted for (scan/claims.py): the real fixtures scan clean, and a stray rank file
copied in under a name of a known pattern that the layout does not claim is an error naming it, is never read,
and makes convert refuse (with --force, the output is the real files' values, bit for bit)."""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from safetensors.numpy import load_file

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.errors import InspectorError
from inspector.scan.claims import Role, claim, optim_role
from inspector.scan.locate import OPTIM_RE
from inspector.scan.model import Checkpoint
from tests.convert.jobs import run
from tests.scan.layout_cases import LAYOUTS, expected, flip_bit, scan_layout, writable

if TYPE_CHECKING:
    from conftest import CliResult

TAG = "global_step3"
EXPERT0 = "moe.deepspeed_moe.experts.deepspeed_experts.0"

# (fixture, file copied, the stray name it is copied to, what the finding says): one case per role and reason
STRAYS = [
    (
        "moe_z2_bf16",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "layer_0_expert_7_mp_rank_00_model_states.pt",
        "MoE layer 0 has 4 experts",
    ),
    (
        "moe_z1_bf16",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "layer_2_expert_0_mp_rank_00_model_states.pt",
        "no MoE layer 2",
    ),
    (
        "moe_z2_bf16",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "layer_0_expert_0_mp_rank_01_model_states.pt",
        "model-parallel rank is 1",
    ),
    (
        "moe_z2_bf16_ws4",
        "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt",
        "bf16_zero_pp_rank_4_mp_rank_00_optim_states.pt",
        "data-parallel rank is 4, but the run has 4",
    ),
    (
        "moe_z0_bf16",
        "expp_rank_1_mp_rank_00_optim_states.pt",
        "expp_rank_2_mp_rank_00_optim_states.pt",
        "expert-parallel rank is 2, but the run has 2",
    ),
    (
        "moe_z0_bf16_ep21",
        "layer_1_expert_1_mp_rank_00_model_states.pt",
        "layer_1_expert_2_mp_rank_00_model_states.pt",
        "MoE layer 1 has 2 experts",
    ),
    (
        "moe_z0_fp16",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "expert_0_mp_rank_00_model_states.pt",
        "has no expert file of this name",
    ),
    (
        "autoep_z2_bf16",
        "layer_0_expert_3_mp_rank_00_model_states.pt",
        "layer_0_expert_4_mp_rank_00_model_states.pt",
        "4 experts per ds_autoep_layers",
    ),
    (
        "autoep_z3_bf16",
        "zero_pp_rank_1_mp_rank_00_model_states.pt",
        "zero_pp_rank_2_mp_rank_00_model_states.pt",
        "data-parallel rank is 2, but the run has 2",
    ),
    (
        "autoep_z3_fp16",
        "zero_pp_rank_0_mp_rank_00_model_states.pt",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "this AutoEP checkpoint has no expert file",
    ),
    (
        "pptp_z1_bf16",
        "layer_01-model_01-model_states.pt",
        "layer_01-model_states.pt",
        "layer files are named layer_XX-model_TT-model_states.pt",
    ),
    (
        "pptp_z1_bf16",
        "layer_01-model_01-model_states.pt",
        "layer_01-model_02-model_states.pt",
        "tensor-parallel rank is 2, but the run has 2",
    ),
    (
        "pp_z1_bf16",
        "layer_01-model_states.pt",
        "layer_01-model_00-model_states.pt",
        "layer files are named layer_XX-model_states.pt",
    ),
    (
        "pp_z1_bf16_dp2",
        "mp_rank_01_model_states.pt",
        "mp_rank_02_model_states.pt",
        "model-parallel rank is 2, but the run has 2",
    ),
    (
        "pp_z0_bf16",
        "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt",
        "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt",
        "data-parallel rank is 1, but the run has 1",
    ),
    (
        "pp_z0_fp16",
        "mp_rank_01_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "ZeRO off in fp16",
    ),
    (
        "tp_z2_bf16_dp2",
        "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt",
        "bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt",
        "data-parallel rank is 2, but the run has 2",
    ),
    (
        "tp_z1_bf16",
        "mp_rank_01_model_states.pt",
        "mp_rank_02_model_states.pt",
        "model-parallel rank is 2, but the run has 2",
    ),
    (
        "tp_z3_bf16_dp2",
        "zero_pp_rank_1_mp_rank_01_model_states.pt",
        "zero_pp_rank_1_mp_rank_02_model_states.pt",
        "model-parallel rank is 2, but the run has 2",
    ),
    (
        "tp_z3_fp16",
        "zero_pp_rank_0_mp_rank_00_model_states.pt",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "this tensor-parallel checkpoint has no expert file",
    ),
    (
        "moe_tp_z1_bf16",
        "layer_0_expert_3_mp_rank_01_model_states.pt",
        "layer_0_expert_4_mp_rank_01_model_states.pt",
        "MoE layer 0 has 4 experts",
    ),
]


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_fixture_scans_with_no_error_finding(name: str) -> None:
    """Each real DeepSpeed save (with the --tp-split its script knew where none is recorded): every file
    claimed, nothing to report as an error."""
    ckpt = scan_layout(name)
    assert not ckpt.errors, [(f.code, f.message) for f in ckpt.errors]
    assert ckpt.tensors


def _with_stray(name: str, tmp_path: Path, copied: str, stray: str) -> Path:
    root = writable(name, tmp_path / "ck")
    shutil.copy(root / TAG / copied, root / TAG / stray)
    return root


def _read_files(ckpt: Checkpoint) -> set[str]:
    """Every file the scan will have anything read from: its file list and every tensor's segments."""
    files = {os.path.basename(f.path) for f in ckpt.files}
    for t in ckpt.tensors:
        files |= {os.path.basename(s.file) for s in (*t.segments, *t.module_copy)}
    return files


@pytest.mark.parametrize(("name", "copied", "stray", "why"), STRAYS, ids=[f"{c[0]}-{c[2]}" for c in STRAYS])
def test_a_stray_rank_file_is_an_error_naming_it_and_is_never_read(
    tmp_path: Path, name: str, copied: str, stray: str, why: str
) -> None:
    ckpt = scan_layout(name, _with_stray(name, tmp_path, copied, stray))
    assert [f.code for f in ckpt.errors] == ["stray-file"], [(f.code, f.message) for f in ckpt.errors]
    (found,) = ckpt.errors
    assert found.message.startswith(f"{stray} does not belong to this checkpoint: ") and why in found.message
    assert found.file is not None and found.file.endswith(stray)
    assert stray not in _read_files(ckpt)
    assert {t.name for t in ckpt.tensors} == {t.name for t in scan_layout(name).tensors}
    with pytest.raises(InspectorError):
        build_plan(ckpt, ConvertOptions(source="module"))


def _converted(ckpt: Checkpoint, out: Path) -> dict[str, np.ndarray]:
    """A forced `--source module` conversion of a checkpoint with error findings, every tensor written."""
    for _ in run(
        build_plan(ckpt, ConvertOptions(source="module", dtype="auto"), allow_damaged=True), str(out)
    ):
        pass
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(glob.glob(os.path.join(out, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors


def test_a_stray_expert_with_expert_0s_names_and_other_values_stands_in_for_nothing(tmp_path: Path) -> None:
    """The attack: `layer_0_expert_7` beside a 4-expert run, holding expert 0's names with other values. Even
    forced, the 16-bit expert 0 written is the live engine's, bit for bit."""
    root = _with_stray(
        "moe_z2_bf16",
        tmp_path,
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "layer_0_expert_7_mp_rank_00_model_states.pt",
    )
    clean = scan_layout("moe_z2_bf16", root)
    (seg,) = clean.tensor(f"{EXPERT0}.0.weight").module_copy
    flip_bit(root / TAG / "layer_0_expert_7_mp_rank_00_model_states.pt", seg.offset + 1)  # other values
    ckpt = scan_layout("moe_z2_bf16", root)
    assert [f.code for f in ckpt.errors] == ["stray-file"]
    written = _converted(ckpt, tmp_path / "out")
    want = expected("moe_z2_bf16")
    for n in (f"{EXPERT0}.0.weight", f"{EXPERT0}.0.bias"):
        assert np.array_equal(written[n].view(np.uint16), want[f"half/{n}"]), n


def test_a_stray_layer_file_of_another_topology_stands_in_for_no_tp_rank(tmp_path: Path) -> None:
    """The attack: `layer_01-model_states.pt` (a re-save without the model axis; here TP rank 1's values)
    beside `layer_01-model_00-…`/`-model_01-…`. Even forced, layer 1 is joined from its two real files."""
    root = _with_stray(
        "pptp_z1_bf16", tmp_path, "layer_01-model_01-model_states.pt", "layer_01-model_states.pt"
    )
    ckpt = scan_layout("pptp_z1_bf16", root)
    assert [f.code for f in ckpt.errors] == ["stray-file"]
    written = _converted(ckpt, tmp_path / "out")
    want = expected("pptp_z1_bf16")
    for n in ("1.weight", "1.bias"):
        assert np.array_equal(written[n].view(np.uint16), want[f"half/{n}"]), n


def test_convert_refuses_a_folder_with_a_stray_file_and_writes_nothing(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = _with_stray(
        "moe_z2_bf16",
        tmp_path,
        "layer_0_expert_0_mp_rank_00_model_states.pt",
        "layer_0_expert_7_mp_rank_00_model_states.pt",
    )
    res = cli("convert", root, tmp_path / "out", "--source", "module")
    assert res.rc != 0
    assert "layer_0_expert_7_mp_rank_00_model_states.pt does not belong to this checkpoint" in res.output
    assert "Traceback" not in res.output
    assert not glob.glob(str(tmp_path / "out" / "*.safetensors"))


def test_files_of_no_checkpoint_pattern_are_left_alone(tmp_path: Path) -> None:
    """Notes, configs and scripts beside the rank files are not checkpoint files: no error, nothing read; a
    `.pt` file of no rank-file name (a one-digit `mp_rank_0`) is one info note naming it."""
    root = writable("tp_z2_bf16", tmp_path / "ck")
    for side in ("zero_to_fp32.py", "notes.txt", "ds_config.json", "mp_rank_0_model_states.pt"):
        (root / TAG / side).write_text("{}")
    ckpt = scan_layout("tp_z2_bf16", root)
    assert not ckpt.errors
    assert not {"zero_to_fp32.py", "notes.txt", "ds_config.json", "mp_rank_0_model_states.pt"} & _read_files(
        ckpt
    )
    notes = [f for f in ckpt.findings if f.code == "not-read"]
    assert len(notes) == 1 and "mp_rank_0_model_states.pt" in notes[0].message
    assert "zero_to_fp32.py" not in notes[0].message


def test_two_files_for_one_role_are_both_named_and_many_strays_are_counted() -> None:
    """The claim pass itself: a second spelling of one rank is a duplicate naming both; past eight stray
    files one more finding counts the rest (a crafted folder's output stays bounded)."""
    names = ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    names += [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2, 22)]
    got = claim("/t", names, [optim_role(2, 1)], "this checkpoint")
    assert got.of(optim_role(2, 1)) == {(0, 0): "/t/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"}
    codes = [f.code for f in got.findings]
    assert codes == ["stray-file"] * 9 + ["duplicate-rank"]
    assert "12 more files" in got.findings[8].message
    assert names[0] in got.findings[-1].message and names[1] in got.findings[-1].message


def test_a_role_table_is_open_to_new_roles() -> None:
    """A layout adds a role as one entry (what other layouts will do): its files are claimed by coordinates."""
    extra = Role("universal marker", OPTIM_RE, lambda m: (int(m.group(2)),))
    got = claim("/t", ["zero_pp_rank_3_mp_rank_00_optim_states.pt", "latest"], [extra], "this layout")
    assert got.of(extra) == {(3,): "/t/zero_pp_rank_3_mp_rank_00_optim_states.pt"}
    assert got.ignored == ["latest"] and not got.findings
