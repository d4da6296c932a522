"""Universal output from AutoEP checkpoints (issue #31): refused, with the reason, until it is what
DeepSpeed's own `ds_to_universal` writes. Compared on the AutoEP fixtures with DeepSpeed 0.19.8: every tensor
was bit-identical, but each expert file lacked the `is_expert_param` / `ep_num_experts` keys that DeepSpeed's
loader (`stage3.load_hp_checkpoint_state`, `universal_checkpoint.load_hp_checkpoint_state`) cuts an AutoEP
expert by, so the folder we wrote would not resume as DeepSpeed's does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.convert.kinds.base import Request, Why
from inspector.convert.kinds.universal import Universal
from inspector.errors import UnsupportedCheckpointError
from inspector.scan.scanner import scan
from tests.scan.layout_cases import ckpt_dir

AUTOEP = ["autoep_z3_bf16", "autoep_z3_bf16_ws4", "autoep_z3_fp16", "autoep_z2_bf16", "autoep_z2_bf16_ws4"]


@pytest.mark.parametrize("config", AUTOEP)
def test_autoep_is_refused_with_a_typed_reason(config: str, tmp_path: Path) -> None:
    ckpt = scan(str(ckpt_dir(config)))
    assert ckpt.parallel is not None and ckpt.parallel.autoep and not ckpt.errors
    offer = Universal().offer(ckpt)
    assert not offer.available and offer.why is Why.LAYOUT
    assert "AutoEP" in offer.reason and "is_expert_param" in offer.reason
    with pytest.raises(UnsupportedCheckpointError, match="AutoEP") as err:
        Universal().plan(ckpt, Request(), str(tmp_path / "out"))
    assert "ds_to_universal" in (err.value.hint or "")
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_autoep_and_writes_nothing(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "cli"
    res = cli("convert", ckpt_dir("autoep_z3_bf16"), out, "--format", "universal")
    assert res.rc == 2 and "AutoEP" in res.output and "ds_to_universal" in res.output, res.output
    assert "Traceback" not in res.output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("config", ["moe_z2_bf16_ws4"])
def test_native_moe_is_still_offered(config: str) -> None:
    ckpt = scan(str(ckpt_dir(config)))
    assert ckpt.parallel is not None and not ckpt.parallel.autoep
    assert Universal().offer(ckpt).available
