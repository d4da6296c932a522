"""Named selections (issue 42): proposed from the layout's own records on the real fixtures (stages from the
placement, experts from the MoE placement, TP split groups from the recorded split, frozen/trainable, the
LoRA adapter); the user's kept in an XDG state file that is read as hostile input; `convert --selection NAME`
writes exactly those tensors, the live engines' values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from inspector.convert import selection_store as store
from inspector.convert.selections import choices, proposed, resolve
from inspector.demo.writer import DemoSpec
from inspector.errors import InvalidOptionError
from inspector.scan.peft import detect_adapter
from inspector.scan.scanner import scan
from tests.convert.kinds.hf import lora_checkpoint
from tests.scan.layout_cases import ckpt_dir, expected, scan_layout

LORA = Path(__file__).parents[1] / "fixtures" / "trainer_lora" / "run"


def _by_name(layout: str) -> dict[str, frozenset[str]]:
    return {s.name: s.tensors for s in proposed(scan_layout(layout))}


def test_pipeline_stages_are_what_each_stage_holds() -> None:
    """make_pipe.py: stage 0 holds layers 1-2 (layer 2's buffer too) and the tied embedding, stage 1 layer 4
    and its copy of the tied embedding; the placement says so, not the names."""
    got = _by_name("pp_z1_bf16")
    assert got == {
        "stage 0": {"tied_modules.embed.weight", "1.weight", "1.bias", "2.scale", "2.norm.weight", "2.norm.bias"},
        "stage 1": {"tied_modules.embed.weight", "4.weight", "4.bias"},
    }


def test_experts_and_tp_groups_come_from_the_records() -> None:
    moe = _by_name("moe_z2_bf16")
    experts = "moe.deepspeed_moe.experts.deepspeed_experts"
    for e in range(4):
        assert moe[f"expert {e}"] == {f"{experts}.{e}.{m}.{p}" for m in (0, 2) for p in ("weight", "bias")}
    assert moe["no experts"] == {"emb.weight", "moe.deepspeed_moe.gate.wg.weight", "head.weight", "head.bias"}
    assert not any(n.startswith("expert ") for n in _by_name("autoep_z2_bf16"))  # fused: no tensor is one expert
    tp = _by_name("tp_z1_bf16")
    layer = "model.layers.0"
    assert tp["TP split on dim 1"] == {f"{layer}.self_attn.o_proj.weight", f"{layer}.mlp.down_proj.weight"}
    assert "lm_head.weight" in tp["TP split on dim 0"] and "model.norm.weight" in tp["TP replicated"]
    pptp = _by_name("pptp_z1_bf16")  # both axes
    assert pptp["stage 1"] == {"3.weight", "3.bias", "4.weight", "4.bias", "5.weight", "5.bias"}
    assert pptp["TP split on dim 1"] == {"3.weight"}


def test_frozen_trainable_and_the_adapter_on_a_lora_model(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ckpt = lora_checkpoint(demo, tmp_path)
    got = {s.name: s.tensors for s in proposed(ckpt)}
    adapter = detect_adapter(ckpt)
    assert adapter is not None and got["LoRA adapter"] == set(adapter.tensors)  # PEFT's own set
    assert got["frozen"] == {t.name for t in ckpt.tensors if "base_layer" in t.name or "original" in t.name
                             or t.name.endswith("norm.weight")}  # fmt: skip
    assert got["trainable"] == {t.name for t in ckpt.tensors} - got["frozen"]
    only_adapter = scan(str(LORA))  # a Trainer LoRA run saves the adapter alone: nothing to narrow
    assert proposed(only_adapter) == ()


def test_a_plain_checkpoint_proposes_its_kinds_and_a_saved_name_is_offered(demo) -> None:  # type: ignore[no-untyped-def]
    ckpt = scan(str(demo(DemoSpec(params=2_000_000))))
    assert [s.name for s in proposed(ckpt)] == ["trainable", "frozen"]
    first = ckpt.tensors[0].name
    listed = choices(ckpt, {"mine": frozenset({first, "not.in.this.tag"}), "gone": frozenset({"x"})})
    assert [(s.name, s.tensors, s.proposed) for s in listed][2:] == [("mine", {first}, False)]
    with pytest.raises(InvalidOptionError, match="'mine'"):  # the refusal lists what there is
        resolve("stage 9", listed)


def test_the_state_file_follows_xdg_and_keeps_both_of_two_saves(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert store.state_folder() == str(tmp_path / "state" / "zero-inspector")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # the spec: a relative path is ignored
    assert store.state_folder() == os.path.join(os.path.expanduser("~"), ".local", "state", "zero-inspector")
    folder = str(tmp_path / "st")
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    store.save(str(tmp_path / "run"), "stage 1", "global_step3", frozenset({"a", "b"}), folder)
    store.save(str(link / "run"), "expert 2", "global_step3", frozenset({"c"}), folder)  # same root
    roots = store.load(folder)
    assert store.of_root(roots, str(tmp_path / "run")) == {"stage 1": {"a", "b"}, "expert 2": {"c"}}
    store.forget(str(tmp_path / "run"), "stage 1", folder)
    assert store.of_root(store.load(folder), str(tmp_path / "run")) == {"expert 2": {"c"}}
    assert sorted(os.listdir(folder)) == [store.FILE]  # written atomically, its lock gone


HOSTILE = {
    "not JSON": b"\x1b]2;pwned\x07 {",
    "another version": json.dumps({"version": 99, "roots": {}}).encode(),
    "an escape in a name": json.dumps(
        {"version": 1, "roots": {"/r": {"\x1b[31mred": {"tag": "t", "tensors": ["a"]}}}}
    ).encode(),
    "a path as a tensor": json.dumps(
        {"version": 1, "roots": {"/r": {"n": {"tag": "t", "tensors": ["../../etc/passwd"]}}}}
    ).encode(),
    "a wrong type": json.dumps({"version": 1, "roots": {"/r": {"n": {"tag": 3, "tensors": ["a"]}}}}).encode(),
    "deep nesting": b'{"version": 1, "roots": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "too large": b" " * (store.MAX_BYTES + 1),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_state_file_is_ignored_unechoed_and_replaced_on_save(case: str, tmp_path: Path) -> None:
    folder = tmp_path / "st"
    folder.mkdir()
    (folder / store.FILE).write_bytes(HOSTILE[case])
    with pytest.raises(store.StateFileProblem) as caught:
        store.load(str(folder))
    said = f"{caught.value.message} {caught.value.hint}"
    assert "\x1b" not in said and "pwned" not in said and "passwd" not in said and "red" not in said
    store.save(str(tmp_path / "run"), "mine", "t", frozenset({"a"}), str(folder))  # a fresh file in its place
    assert store.of_root(store.load(str(folder)), str(tmp_path / "run")) == {"mine": {"a"}}


def test_a_link_or_fifo_as_the_state_file_is_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "st"
    folder.mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"version": 1, "roots": {}}))
    (folder / store.FILE).symlink_to(secret)
    with pytest.raises(store.StateFileProblem):
        store.load(str(folder))
    os.remove(folder / store.FILE)
    os.mkfifo(folder / store.FILE)  # reading a FIFO would block the app: refused before opening
    with pytest.raises(store.StateFileProblem):
        store.load(str(folder))


def test_the_file_is_bounded(tmp_path: Path) -> None:
    folder = str(tmp_path / "st")
    for i in range(store.MAX_ROOTS + 3):  # the least recently saved checkpoints go first
        store.save(f"/runs/{i}", "s", "t", frozenset({"a"}), folder)
    roots = store.load(folder)
    assert len(roots) == store.MAX_ROOTS and "/runs/0" not in roots and f"/runs/{store.MAX_ROOTS + 2}" in roots
    for i in range(store.MAX_NAMES):
        store.save("/runs/x", f"n{i}", "t", frozenset({"a"}), folder)
    store.save("/runs/x", "n0", "t", frozenset({"b"}), folder)  # replacing one is not one more
    with pytest.raises(store.OutputError, match="At most"):
        store.save("/runs/x", "one more", "t", frozenset({"a"}), folder)
    assert len(store.load(folder)[store.root_key("/runs/x")]) == store.MAX_NAMES


def test_convert_selection_writes_that_stage_as_the_engine_held_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("convert", ckpt_dir("pp_z1_bf16"), tmp_path / "out", "--selection", "stage 1", "--dtype", "fp32")
    assert r.rc == 0, r.stderr
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    want = expected("pp_z1_bf16")
    assert set(got) == {"tied_modules.embed.weight", "4.weight", "4.bias"}
    for n, v in got.items():
        assert np.array_equal(v.view(np.uint32), want[f"fp32/{n}"].view(np.uint32)), n


def test_convert_selection_reads_a_saved_one_and_refuses_what_it_cannot(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = ckpt_dir("moe_z2_bf16")
    store.save(str(path), "heads", "global_step3", frozenset({"head.weight", "head.bias"}))  # as `m` saves
    r = cli("convert", path, tmp_path / "a", "--selection", "heads")
    assert r.rc == 0, r.stderr
    assert set(load_file(str(tmp_path / "a" / "model.safetensors"))) == {"head.weight", "head.bias"}
    r = cli("convert", path, tmp_path / "b", "--selection", "\x1b[2Jnope")
    assert r.rc != 0 and "'expert 3'" in r.stderr and "'heads'" in r.stderr and "\x1b" not in r.stderr
    r = cli("convert", path, tmp_path / "c", "--selection", "heads", "--include", "emb")
    assert r.rc != 0 and "use one" in r.stderr.lower()
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
