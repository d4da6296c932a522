"""The input attack classes through the app: each hostile checkpoint opens on an error dialog that says what
is wrong (never "Unexpected error", never a crash), and no secret or raw escape reaches the screen."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from inspector.demo.writer import DemoSpec, write_demo
from inspector.tui.app import make_app
from inspector.tui.screens.dialogs import MessageDialog
from tests.tui.conftest import plain, wait_for

pytestmark = pytest.mark.asyncio
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)
TAG = "global_step3"
SECRET = "ZI_TUI_SECRET=hunter2"


def _model(root: Path, edit: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    path = root / TAG / "mp_rank_00_model_states.pt"
    sd = torch.load(path, weights_only=True)
    edit(sd)
    torch.save(sd, path)


def stray_rank(root: Path) -> str:
    (root / TAG / "bf16_zero_pp_rank_1000000000_mp_rank_00_optim_states.pt").write_bytes(b"")
    return "1,000,000,000"


def negative_shape(root: Path) -> str:
    def edit(sd: dict) -> None:  # type: ignore[type-arg]
        g = sd["param_shapes"][0]
        g[next(iter(g))] = (-4, 8)

    _model(root, edit)
    return "param_shapes"


def shared_params_list(root: Path) -> str:
    _model(root, lambda sd: sd.update(shared_params=["a", "b"]))
    return "shared_params"


def latest_linked_to_a_secret(root: Path) -> str:
    secret = root.parent / "secret.env"
    secret.write_text(SECRET)
    (root / "latest").unlink()
    (root / "latest").symlink_to(secret)
    return "latest"


def copied_rank_file(root: Path) -> str:
    files = sorted((root / TAG).glob("*optim_states.pt"))
    shutil.copy(files[0], files[1])
    return "rank"


@pytest.mark.parametrize(
    "damage", [stray_rank, negative_shape, shared_params_list, latest_linked_to_a_secret, copied_rank_file]
)
async def test_hostile_checkpoints_open_on_a_clear_dialog(
    tmp_path: Path, damage: Callable[[Path], str]
) -> None:
    root = tmp_path / "ckpt"
    write_demo(str(root), SPEC)
    needle = damage(root)
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(
            pilot,
            lambda: (
                (isinstance(app.screen, MessageDialog) and bool(app.screen.query("#dialog-body")))
                or (app.ckpt is not None and bool(app.ckpt.errors))
            ),
            "a refusal",
        )
        screen = app.export_screenshot()
        assert "Unexpected error" not in screen
        assert SECRET not in screen and "hunter2" not in screen and "\x1b]" not in screen
        if isinstance(app.screen, MessageDialog):
            assert needle in plain(app.screen.query_one("#dialog-body"))
        else:  # scanned with error findings: shown, and converting asks first
            assert any(needle in f.message for f in app.ckpt.errors)
