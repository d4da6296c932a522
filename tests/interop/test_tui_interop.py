"""The terminal UI on checkpoints written by real DeepSpeed and Hugging Face Trainer: every flow.

Open, select a submodule, convert, verify; `s` statistics of a partitioned, padded tensor; the universal
export; a Trainer run folder's model-folder and adapter exports; a damaged copy. Conversions and
verifications run as the app runs them (child processes); what they write is compared with DeepSpeed's own
reconstruction of the same tensors, DeepSpeed's own `ds_to_universal`, and transformers / PEFT loading it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import inspector.tui.screens.tensor_stats as tensors_screen  # where the statistics job draws its lines
from inspector.convert.options import ConvertOptions
from inspector.health.numerics import MEAN_SPAN, STD_REL
from inspector.health.tensor import Difference, TensorStats
from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.widgets.tensor_detail import _num
from tests.tui.conftest import choose_universal, plain

pytestmark = pytest.mark.interop


async def _until(pilot, predicate, limit: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    waited = 0.0
    while not predicate():
        await pilot.pause(0.1)
        waited += 0.1
        assert waited < limit, "the app did not get there"


async def _convert(pilot, app) -> None:  # type: ignore[no-untyped-def]
    """Wait for the conversion the app started (in its child process) to finish; it must succeed."""
    await _until(
        pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase in ("done", "failed")
    )
    assert app.screen.phase == "done", plain(app.screen.query_one("#result"))


async def _verify(pilot, app) -> None:  # type: ignore[no-untyped-def]
    """`v` on the finished conversion: the verify child re-reads every source slice; it must pass."""
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
    assert app.screen.phase == "verified", plain(app.screen.query_one("#result"))


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
            await _convert(pilot, app)
            await _verify(pilot, app)
            return chosen

    chosen = asyncio.run(drive())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == chosen
        for name in chosen:
            if name in ref.tensors and ref.kinds.get(name) == "trainable":
                assert torch.equal(f.get_tensor(name), ref.tensors[name].float()), name


# --- statistics ---------------------------------------------------------------------------------------------


async def _focus_tensor(pilot, app, name: str) -> None:  # type: ignore[no-untyped-def]
    """The Tensors tab, its tree unfolded down to tensor `name`, the cursor on it."""
    await pilot.press("t")
    assert app.main.tensors_pane.module_tree.reveal(name)
    await pilot.pause()
    await pilot.pause()
    assert app.main.tensors_pane.detail.tensor is not None
    assert app.main.tensors_pane.detail.tensor.name == name


def _split_and_padded(ckpt, ref) -> object:  # type: ignore[no-untyped-def]
    """The largest trainable tensor whose values live on more than one rank; on stage 3 one whose size does
    not divide by the world size, so the last rank's partition ends in padding."""
    found = [
        t
        for t in ckpt.tensors
        if ref.kinds.get(t.name) == "trainable"
        and len({s.file for s in t.segments}) >= 2
        and (ckpt.stage != 3 or t.numel % ckpt.world_size)
    ]
    assert found, "no trainable tensor is split across ranks"
    return max(found, key=lambda t: t.numel)


@pytest.mark.configs("s2_bf16", "s3_bf16", "s3_sub_group")
def test_statistics_equal_torch_on_deepspeeds_reconstruction(
    config: str, ds_checkpoint: Callable, reference: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`s` on the Tensors tab of a real checkpoint: the numbers the panel shows are torch's, computed from
    DeepSpeed's own reconstruction of the same (partitioned, padded) fp32 master."""
    built, ref = ds_checkpoint(config), reference(config)
    seen: list = []  # the TensorStats and Difference the panel was drawn from (whatever else is passed)
    for fn in ("stats_renderable", "difference_line"):
        real = getattr(tensors_screen, fn)

        def spy(*a: object, _real: Callable = real) -> object:
            seen.extend(x for x in a if isinstance(x, (TensorStats, Difference)))
            return _real(*a)

        monkeypatch.setattr(tensors_screen, fn, spy)

    async def drive() -> tuple[str, str]:
        app = make_app(path=str(built.root), live_meters=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await _until(pilot, lambda: app.ckpt is not None)
            t = _split_and_padded(app.ckpt, ref)
            await _focus_tensor(pilot, app, t.name)
            pane = app.main.tensors_pane
            await pilot.press("s")
            await _until(pilot, lambda: bool(seen) and "histogram" in plain(pane.detail))
            return t.name, plain(pane.detail)

    name, text = asyncio.run(drive())
    x = ref.tensors[name]
    assert x.dtype == torch.float32
    finite = x[torch.isfinite(x)].double()
    st = next(s for s in seen if isinstance(s, TensorStats))
    assert st.numel == x.numel()  # no padding read as values
    assert st.minimum == finite.min().item() and st.maximum == finite.max().item()
    assert st.absmax == finite.abs().max().item()
    # the one statistics engine's stated bounds (health/numerics.py), which `health` is held to as well
    span = st.maximum - st.minimum
    assert abs(st.mean - finite.mean().item()) <= MEAN_SPAN * span
    assert math.isclose(st.std, finite.std(unbiased=False).item(), rel_tol=STD_REL)
    assert st.zeros == int((x == 0).sum())
    assert st.nans == int(torch.isnan(x).sum()) and st.infs == int(torch.isinf(x).sum())
    assert sum(st.histogram) == finite.numel()
    assert "Cannot read it" not in text
    for value in (st.minimum, st.maximum, st.mean, st.std, st.absmax):  # what the panel shows
        assert _num(value) in text, (_num(value), text)
    assert f"{st.zeros:,} ({st.zeros / st.numel:.1%})" in text
    if name in ref.module:  # stages 1-2: the 16-bit module copy is compared with the master
        diff = next(d for d in seen if isinstance(d, Difference))
        copy = ref.module[name].double()
        assert diff.numel == x.numel()
        assert diff.differing == int((copy != x.double()).sum())
        assert math.isclose(diff.max_abs, (copy - x.double()).abs().max().item(), rel_tol=1e-6)
        assert "module copy vs master" in text


# --- universal export ---------------------------------------------------------------------------------------


def _uni_states(root: Path) -> dict[str, tuple[torch.Tensor, object]]:
    """`<param>/<state>` -> (tensor, cat_dim) for every zero/<param>/<state>.pt under the universal folder
    `latest_universal` names (ours and DeepSpeed's stages 1-2 save {"param", "cat_dim"}; its stage 3 a bare
    tensor)."""
    tag = (root / "latest_universal").read_text().strip()
    out: dict[str, tuple[torch.Tensor, object]] = {}
    for f in sorted((root / tag / "zero").glob("*/*.pt")):
        x = torch.load(f, map_location="cpu", weights_only=True)
        out[f"{f.parent.name}/{f.stem}"] = (
            (x["param"], x.get("cat_dim")) if isinstance(x, dict) else (x, None)
        )
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".done"
    }


@pytest.mark.configs("s1_bf16", "s2_bf16", "s3_bf16")
def test_universal_export_equals_ds_to_universal(
    config: str,
    ds_checkpoint: Callable,
    reference: Callable,
    universal_root: Callable[[str, str], Path],
    tmp_path: Path,
) -> None:
    """Export options → format "universal" → convert (the child) → verify: every state file the UI wrote
    holds exactly the tensor DeepSpeed's `ds_to_universal --inject_missing_state` writes for it, and the
    folder is byte for byte what `convert --format universal` writes from the command line."""


    built, ref = ds_checkpoint(config), reference(config)
    out = tmp_path / "out"

    async def drive() -> None:
        app = make_app(path=str(built.root), out_dir=str(out), live_meters=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await _until(pilot, lambda: app.ckpt is not None)
            assert "Fits" in await choose_universal(pilot)
            await pilot.press("ctrl+s")
            await _convert(pilot, app)
            await _verify(pilot, app)

    asyncio.run(drive())
    tag = (built.root / "latest").read_text().strip()
    assert (out / "latest_universal").read_text().strip() == f"{tag}_uni"
    ours, theirs = _uni_states(out), _uni_states(universal_root(config, "theirs"))
    trainable = {n for n, k in ref.kinds.items() if k == "trainable"}
    frozen = {n for n, k in ref.kinds.items() if k == "frozen"}
    assert {k.split("/")[0] for k in ours if k.endswith("/exp_avg")} == trainable
    # frozen params get an fp32 copy, as ds_to_universal writes on stages 1-2; on stage 3 it writes none,
    # so there they are compared with DeepSpeed's reconstruction of the 16-bit weights
    assert {k for k in ours if k.split("/")[0] in frozen} == {f"{n}/fp32" for n in frozen}
    only_ours = set(ours) - set(theirs)
    assert only_ours == (set() if ref.stage < 3 else {f"{n}/fp32" for n in frozen}), only_ours
    for key in only_ours:
        assert torch.equal(ours[key][0], ref.tensors[key.split("/")[0]].float()), key
    for key, (tensor, cat_dim) in ours.items():
        if key in only_ours:
            continue
        their_tensor, their_cat_dim = theirs[key]
        if ref.stage == 3:  # DeepSpeed's stage-3 path saves the bare, flat tensor (its loader reshapes)
            assert their_tensor.dim() == 1 and their_cat_dim is None, key
            their_tensor = their_tensor.view(tensor.shape)
        assert tensor.dtype == their_tensor.dtype and torch.equal(tensor, their_tensor), key
        assert their_cat_dim is None or cat_dim == their_cat_dim, key
    # DeepSpeed also writes tied aliases and buffers as fp32.pt; the universal loader needs neither
    extra = {k.split("/")[0] for k in set(theirs) - set(ours)}
    assert extra <= set(ref.aliases) | {n for n, k in ref.kinds.items() if k == "buffer"}, extra
    # what the UI's child wrote is what the command line writes
    assert _files(out) == _files(universal_root(config, "ours"))


# --- a Hugging Face Trainer run -----------------------------------------------------------------------------


async def _export(pilot, app, kind: str, dtype: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """Export options: choose the output kind (and dtype), wait for a preflight that fits, convert."""
    from textual.widgets import Select

    from inspector.tui.screens.export import ExportScreen

    await pilot.press("e")
    assert isinstance(app.screen, ExportScreen)
    fmt = app.screen.query_one("#format", Select)
    assert kind in {v for _, v in fmt._options}, fmt._options
    fmt.value = kind
    if dtype is not None:
        app.screen.query_one("#dtype", Select).value = dtype
    await pilot.pause()
    await _until(pilot, lambda: "Fits" in plain(app.screen.query_one("#preflight")))
    await pilot.press("ctrl+s")
    await _convert(pilot, app)


def _hf_reference(work: Path) -> dict[str, torch.Tensor]:
    return dict(torch.load(work / "reference.pt", map_location="cpu", weights_only=True)["tensors"])


def test_trainer_run_folder_model_export_loads(hf_run: Callable[[str], Path], tmp_path: Path) -> None:
    """A Trainer output_dir holding checkpoint-9/ (an older LoRA run) and checkpoint-10/ (the full ZeRO-3
    run): both are listed as roots, the newest in natural order is opened (not checkpoint-9, which sorts
    last as text), and its "Hugging Face model folder" export, converted in the child, loads in
    transformers with no missing or unexpected keys and holds DeepSpeed's own reconstruction."""
    from textual.widgets import Select
    from transformers import AutoModelForCausalLM

    full, lora = hf_run("full"), hf_run("lora")
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint-9").symlink_to(next((lora / "run").glob("checkpoint-*")))
    (run / "checkpoint-10").symlink_to(next((full / "run").glob("checkpoint-*")))
    out = tmp_path / "model"

    async def drive() -> None:
        app = make_app(path=str(run), out_dir=str(out), live_meters=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await _until(pilot, lambda: app.ckpt is not None)
            assert app.roots == (str(run / "checkpoint-9"), str(run / "checkpoint-10"))
            roots = app.main.query_one("#roots", Select)
            assert "-hidden" not in roots.classes
            assert {v for _, v in roots._options} >= set(app.roots)
            assert app.root == str(run / "checkpoint-10") and roots.value == app.root
            assert app.ckpt.stage == 3
            await _export(pilot, app, "model", "fp32")
            await _verify(pilot, app)

    asyncio.run(drive())
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= names
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.dtype == torch.float32
    state = model.state_dict()
    ref = _hf_reference(full)
    assert ref and set(ref) <= set(state)
    for k, v in ref.items():
        assert torch.equal(state[k], v.float()), k


def test_trainer_lora_run_adapter_export_loads_in_peft(hf_run: Callable[[str], Path], tmp_path: Path) -> None:
    """The LoRA run's own output_dir (one checkpoint-N/ inside): the "PEFT LoRA adapter" export loads with
    PeftModel.from_pretrained onto the base folder its adapter_config names, holding DeepSpeed's fp32
    reconstruction of the trained adapter in the run's compute dtype (auto: bf16), byte for byte what PEFT's
    save_pretrained wrote beside the checkpoint."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from inspector.scan.peft import peft_key

    work = hf_run("lora")
    ckpt = next((work / "run").glob("checkpoint-*"))
    out = tmp_path / "adapter"

    async def drive() -> None:
        app = make_app(path=str(work / "run"), out_dir=str(out), live_meters=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await _until(pilot, lambda: app.ckpt is not None)
            assert app.ckpt.root == str(ckpt)
            await _export(pilot, app, "adapter")

    asyncio.run(drive())
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names
    assert (out / "adapter_config.json").read_bytes() == (ckpt / "adapter_config.json").read_bytes()
    with (
        safe_open(out / "adapter_model.safetensors", "pt") as ours,
        safe_open(ckpt / "adapter_model.safetensors", "pt") as peft,
    ):
        keys = peft.keys()
        assert set(ours.keys()) == set(keys)
        for k in keys:
            mine, theirs = ours.get_tensor(k), peft.get_tensor(k)
            assert mine.dtype == theirs.dtype == torch.bfloat16 and torch.equal(mine, theirs), k
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(work / "base"), out)
    loaded = get_peft_model_state_dict(model)
    trained = {peft_key(k, "default"): v for k, v in _hf_reference(work).items() if ".lora_" in k}
    assert trained and set(loaded) == set(trained)
    for k, v in trained.items():
        assert torch.equal(loaded[k], v.to(torch.bfloat16).to(loaded[k].dtype)), k


# --- a damaged checkpoint -----------------------------------------------------------------------------------


@pytest.mark.configs("s2_bf16", "s3_bf16")
def test_damaged_real_checkpoint_shows_findings_and_asks(
    config: str, ds_checkpoint: Callable, tmp_path: Path
) -> None:
    """A copy of a real checkpoint with rank 1's optimizer file cut in half: the overview shows the damage
    banner and a finding naming that file, and `c` asks before converting; "no" writes nothing."""
    import os
    import shutil

    from inspector.tui.screens.dialogs import ConfirmDialog

    root = tmp_path / "damaged"
    shutil.copytree(ds_checkpoint(config).root, root)
    tag = (root / "latest").read_text().strip()
    rank1 = next((root / tag).glob("*zero_pp_rank_1_*optim_states.pt"))
    with open(rank1, "r+b") as fh:
        fh.truncate(os.path.getsize(rank1) // 2)
    out = tmp_path / "out"

    async def drive() -> None:
        app = make_app(path=str(root), out_dir=str(out), live_meters=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _until(
                pilot,
                lambda: app.ckpt is not None or "-hidden" not in app.main.query_one("#banner").classes,
            )
            await pilot.pause()
            assert app.ckpt is not None and app.ckpt.errors
            banner = app.main.query_one("#banner")
            assert "-hidden" not in banner.classes
            assert "damaged" in plain(banner)
            from inspector.tui.widgets.summary import FindingsView

            assert rank1.name in plain(app.main.query_one(FindingsView))
            await pilot.press("c")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
            assert "damaged" in app.screen.title_text
            await pilot.press("n")
            await _until(pilot, lambda: not isinstance(app.screen, ConfirmDialog))
            assert not isinstance(app.screen, ConvertScreen) and not app.converting

    asyncio.run(drive())
    assert not out.exists()
