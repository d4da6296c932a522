"""Regenerate the README screenshots of the terminal UI: the app driven headless on a demo checkpoint.

    python screenshots/make_tui_screenshots.py

Uses the app factory the CLI uses; the machine's figures (free memory and disk, the converter's RSS) are
replaced by fixed ones so the pictures do not change from run to run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile

from textual.widgets import Input

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from inspector.convert.kinds.safetensors import SafetensorsJob  # noqa: E402
from inspector.convert.options import ConvertOptions  # noqa: E402
from inspector.convert.plan import build_plan  # noqa: E402
from inspector.demo.writer import DemoSpec, write_demo  # noqa: E402
from inspector.tui.app import make_app  # noqa: E402
from inspector.tui.frozen import fake_progress, frozen_assess  # noqa: E402
from inspector.tui.messages import ChildEvent  # noqa: E402
from inspector.tui.screens.convert import ConvertScreen  # noqa: E402


async def _until(pilot, predicate) -> None:  # type: ignore[no-untyped-def]
    for _ in range(1200):
        if predicate():
            return
        await pilot.pause(0.05)
    raise RuntimeError("the app did not get there")


async def shoot(root: str, out: str) -> None:
    def new_app(**kw):  # type: ignore[no-untyped-def]
        app = make_app(path=root, out_dir=out, live_meters=False, **kw)
        app.frozen_assess = frozen_assess()
        return app

    def save(app, name: str) -> None:  # type: ignore[no-untyped-def]
        for screen in app.screen_stack:  # a steady cursor, not whichever phase of its blink the shot catches
            for field in screen.query(Input):
                field.cursor_blink = False
        app.save_screenshot(
            os.path.join(HERE, f"{name}.svg"),
        )
        print("wrote", os.path.join(HERE, f"{name}.svg"))

    for size, suffix in (((120, 36), ""), ((80, 24), "-80x24")):
        app = new_app()
        async with app.run_test(size=size) as pilot:
            await _until(pilot, lambda a=app: a.ckpt is not None)
            await pilot.pause()
            save(app, f"tui-overview{suffix}")

    app = new_app(options=ConvertOptions(include=("model.layers.0", "model.layers.1"), dtype="bf16"))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(pilot, lambda: app.ckpt is not None)
        await pilot.press("t")
        app.main.tensors_pane.module_tree.reveal("model.layers.1.mlp.up_proj.weight")
        await pilot.pause()
        await pilot.pause()
        await pilot.press("s")
        pane = app.main.tensors_pane
        await _until(pilot, lambda: pane._cancel.is_set() and bool(pane._results))
        await pilot.pause()
        save(app, "tui-tensors")
        await pilot.press("e")
        await _until(pilot, lambda: app.screen.query_one("#preflight").assessment is not None)
        await pilot.pause()
        save(app, "tui-export")

    app = new_app(options=ConvertOptions(shard_size=20_000_000, dtype="bf16"))
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(pilot, lambda: app.ckpt is not None)
        screen = ConvertScreen(autostart=False)
        await app.push_screen(screen)
        plan = build_plan(app.ckpt, app.convert_options())
        job = SafetensorsJob("weights", out, plan)
        peak = frozen_assess()(job).predicted_peak_rss
        screen.show_started(job, peak)
        parts = [0.5, 0.7, 0.85, 0.9, 0.92, 0.93, 0.94, 0.95, 0.94, 0.93, 0.94, 0.94, 0.93, 0.94] * 4
        for i, part in enumerate(parts):  # a run under its prediction, as the measured ones are
            screen.query_one("#meter").add_sample(int(peak * part), 21 * 2**30 - i * 2**20)
        for ev in fake_progress(plan, 0.57, seconds=1.9):
            screen.post_message(ChildEvent("convert", ev))
        await pilot.pause()
        save(app, "tui-convert")
        await pilot.press("question_mark")
        await pilot.pause()
        save(app, "tui-help")


def write_moved_run(root: str) -> None:
    """Two tags of one run for the Health picture: every master moved a little between them, and one layer's
    down projection blew up (x30) with a few NaN in its Adam exp_avg_sq: what a diverging layer looks like."""
    import numpy as np

    from inspector.demo.values import expected
    from inspector.scan.model import Kind
    from inspector.scan.scanner import scan
    from tests.health.planting import overwrite, plant

    spec = DemoSpec(stage=2, world_size=2, params=20_000_000)
    write_demo(root, DemoSpec(stage=2, world_size=2, params=20_000_000, tag="global_step100"))
    write_demo(root, DemoSpec(stage=2, world_size=2, params=20_000_000, tag="global_step200"))
    ckpt = scan(root, "global_step200")
    rng = np.random.default_rng(0)
    for t in ckpt.tensors:
        if t.segments and t.kind is Kind.TRAINABLE:
            values = np.asarray(expected(spec, t.name), dtype=np.float32).reshape(-1)
            step = 0.02 * (1 + t.name.count("layers.3")) * rng.standard_normal(values.shape[0]).astype(np.float32)
            moved = values * (30.0 if t.name == BLOWN else 1.0) + step * np.abs(values).mean()
            overwrite(t.segments, moved)
            if t.module_copy:  # the 16-bit copy follows its master, as after a real step
                overwrite(t.module_copy, moved)
    plant(dict(ckpt.tensor(BLOWN).moments)["exp_avg_sq"], [7, 70, 700], [float("nan")] * 3)


BLOWN = "model.layers.3.mlp.down_proj.weight"


async def shoot_health(root: str) -> None:
    app = make_app(path=root, live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(pilot, lambda: app.ckpt is not None)
        await pilot.press("h")
        pane = app.main.health_pane
        await _until(pilot, lambda: pane.report is not None and not pane.running)
        await pilot.pause()
        app.save_screenshot(os.path.join(HERE, "tui-health.svg"))
        print("wrote", os.path.join(HERE, "tui-health.svg"))


EXPERTS = "moe.deepspeed_moe.experts.deepspeed_experts"


async def shoot_layout(root: str) -> None:
    """An MoE checkpoint saved by real DeepSpeed (tests/fixtures/layouts/moe_z2_bf16_ws4: ZeRO-2, 4 ranks,
    EP 2): the Tensors tab with its experts under their global index and the ranks holding each."""
    app = make_app(path=root, live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await _until(pilot, lambda: app.ckpt is not None)
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        tree.reveal(f"moe2.{EXPERTS[4:]}.1")  # the second MoE layer: ep_size 1, each expert on all four ranks
        await pilot.pause()
        tree.reveal(f"{EXPERTS}.3")
        await pilot.pause()
        await pilot.pause()
        app.save_screenshot(os.path.join(HERE, "tui-moe-tree.svg"))
        print("wrote", os.path.join(HERE, "tui-moe-tree.svg"))


def main() -> int:
    tmp = os.path.join(tempfile.gettempdir(), "zero-inspector-screenshots")  # a fixed path: the header shows it
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        root = os.path.join(tmp, "demo-checkpoint")
        write_demo(root, DemoSpec(stage=2, world_size=2, params=30_000_000))  # what `--demo` writes
        asyncio.run(shoot(root, os.path.join(tmp, "out")))
        run = os.path.join(tmp, "run")
        write_moved_run(run)
        asyncio.run(shoot_health(run))
        moe = os.path.join(tmp, "moe-checkpoint")
        fixture = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "layouts", "moe_z2_bf16_ws4", "ckpt")
        shutil.copytree(fixture, moe)  # a real DeepSpeed MoE checkpoint, at a fixed path as the demo
        asyncio.run(shoot_layout(moe))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
