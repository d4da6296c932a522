"""The terminal UI on checkpoints written by real DeepSpeed: open, select a submodule, convert, verify.

The conversion and verification run as the app runs them (child processes); the output is compared with
DeepSpeed's own reconstruction of the same tensors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from inspector.convert.plan import ConvertOptions
from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen

pytestmark = pytest.mark.interop


async def _until(pilot, predicate, limit: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    waited = 0.0
    while not predicate():
        await pilot.pause(0.1)
        waited += 0.1
        assert waited < limit, "the app did not get there"


@pytest.mark.configs("s1_bf16", "s2_bf16", "s3_bf16", "s3_sub_group")
def test_open_select_convert_verify(
    config: str, ds_checkpoint: Callable, reference: Callable, tmp_path: Path
) -> None:
    built, ref = ds_checkpoint(config), reference(config)
    out = tmp_path / "out"

    async def drive() -> set[str]:
        app = make_app(
            path=str(built.root), out_dir=str(out), options=ConvertOptions(dtype="fp32"), live_meters=False
        )
        async with app.run_test(size=(120, 36)) as pilot:
            await _until(pilot, lambda: app.ckpt is not None)
            assert app.ckpt.stage == ref.stage and app.ckpt.world_size == ref.world_size
            # the submodule of the largest weight: a real, multi-tensor choice whatever the model's names
            biggest = max(app.ckpt.tensors, key=lambda t: t.numel)
            prefix = biggest.name.rsplit(".", 2)[0]
            app.set_selection(t.name for t in app.ckpt.tensors if t.name.startswith(prefix + "."))
            chosen = set(app.selected)
            await pilot.press("c")
            await _until(
                pilot,
                lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase in ("done", "failed"),
            )
            assert app.screen.phase == "done", app.screen.query_one("#result").render()
            await pilot.press("v")
            await _until(
                pilot,
                lambda: (
                    app.screen.phase == "verified"
                    or (
                        app.screen.job == "verify"
                        and app.screen.child is not None
                        and not app.screen.child.running
                        and app.screen.phase != "verifying"
                    )
                ),
            )
            assert app.screen.phase == "verified"
            return chosen

    chosen = asyncio.run(drive())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == chosen
        for name in chosen:
            if name in ref.tensors and ref.kinds.get(name) == "trainable":
                assert torch.equal(f.get_tensor(name), ref.tensors[name].float()), name
