"""Universal output from AutoEP checkpoints (issue #31): every tensor, step and expert file's metadata equal to
DeepSpeed 0.19.8's own `ds_to_universal` output (tests/fixtures/universal_layouts/autoep_*.npz, made by
make_autoep_refs.py). The metadata is what DeepSpeed's loader cuts an AutoEP expert by
(`is_expert_param`, `ep_num_experts`: `stage3.load_hp_checkpoint_state`,
`universal_checkpoint.load_hp_checkpoint_state`); without it, resuming failed in DeepSpeed's loader
("start (1536) + length (1536) exceeds dimension size (2304)" at ZeRO-3). Resumed by real DeepSpeed in
tests/interop/test_universal_autoep_interop.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inspector.convert.kinds.universal import Universal
from inspector.convert.kinds.universal.plan import plan_universal
from inspector.scan.scanner import scan
from tests.convert.jobs import universal as write_universal
from tests.scan.layout_cases import ckpt_dir

REFS = Path(__file__).resolve().parents[2] / "fixtures" / "universal_layouts"
AUTOEP = ["autoep_z3_bf16", "autoep_z3_bf16_ws4", "autoep_z3_fp16", "autoep_z2_bf16", "autoep_z2_bf16_ws4"]
EXPERTS = [f"model.layers.0.mlp.experts.w{i}" for i in (1, 2, 3)]


def _written(folder: Path) -> dict[str, Any]:
    """Every `zero/<name>/<state>.pt` as loaded by torch (the way DeepSpeed's loader reads it)."""
    return {
        f"{p.stem}/{p.parent.name}": torch.load(p, weights_only=False)
        for p in (folder / "zero").glob("*/*.pt")
    }


def _write(config: str, tmp_path: Path) -> dict[str, Any]:
    ckpt = scan(str(ckpt_dir(config)))
    assert ckpt.parallel is not None and ckpt.parallel.autoep and not ckpt.errors
    assert Universal().offer(ckpt).available
    plan = plan_universal(ckpt, str(tmp_path))
    write_universal(plan)
    return _written(Path(plan.out_dir))


@pytest.mark.parametrize("config", ["autoep_z3_bf16", "autoep_z2_bf16"])
def test_every_tensor_step_and_expert_key_equals_ds_to_universal(config: str, tmp_path: Path) -> None:
    got = _write(config, tmp_path)
    with np.load(REFS / f"{config}.npz") as z:
        want = {k: z[k] for k in z.files}
    assert sorted(got) == sorted(k for k in want if not k.startswith("meta/"))
    for key, ref in want.items():
        if key.startswith("step/"):
            assert float(got[key]) == float(ref), key
        elif key.startswith("meta/"):  # the keys beside `param`, where DeepSpeed writes a dict
            mine = {k: v for k, v in got[key[len("meta/") :]].items() if k != "param"}
            assert json.dumps(mine, sort_keys=True) == str(ref), key
        else:  # ZeRO-3's dense parameters: DeepSpeed writes them flat, ours carry the shape
            mine = got[key]["param"]
            assert mine.dtype == torch.float32, key
            assert np.array_equal(mine.reshape(-1).numpy().view(np.uint32), ref.view(np.uint32)), key
    for name in EXPERTS:  # the keys DeepSpeed's loader cuts by: compared above, named here
        assert f"meta/fp32/{name}" in want and '"is_expert_param": true' in str(want[f"meta/fp32/{name}"])


@pytest.mark.parametrize("config", AUTOEP)
def test_every_expert_file_says_it_is_one_whole_expert_tensor(config: str, tmp_path: Path) -> None:
    got = _write(config, tmp_path)
    for name in EXPERTS:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            f = got[f"{state}/{name}"]
            assert f["param"].shape[0] == 4  # the fixtures' four experts, in global order
            assert {k: v for k, v in f.items() if k != "param"} == {
                "cat_dim": 0,
                "is_expert_param": True,
                "ep_num_experts": 4,
            }
    dense = [k for k in got if "experts" not in k and not k.startswith("step/")]
    assert dense and all("is_expert_param" not in got[k] for k in dense)


@pytest.mark.parametrize("config", ["autoep_z3_bf16_ws4", "autoep_z2_bf16"])
def test_verify_reads_the_whole_experts_back_and_names_a_changed_one(
    config: str, tmp_path: Path, cli: Any
) -> None:
    """The model states record each expert weight's local shard; the scan of the universal folder takes the
    logical `[num_experts, ...]` shape from the AutoEP records, so verify agrees, and finds a changed expert."""
    root, out = ckpt_dir(config), tmp_path / "out"
    assert cli("convert", root, out, "--format", "universal").rc == 0
    ok = cli("verify", root, out)
    assert ok.rc == 0 and "OK: universal output" in ok.output, ok.output
    path = out / "global_step3_uni" / "zero" / "model.layers.0.mlp.experts.w2" / "exp_avg.pt"
    value = torch.load(path, weights_only=False)
    value["param"][3, 5, 7] += 1.0  # the last expert: held by expert-parallel rank 1
    torch.save(value, path)
    res = cli("verify", root, out)
    assert res.rc == 1 and "experts.w2/exp_avg" in res.output, res.output
