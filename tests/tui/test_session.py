"""The selection rules, the module tree, the filter and root discovery: plain data, no screen."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from inspector.convert.options import ConvertOptions, select
from inspector.remote.roots import source_at
from inspector.scan.locate import discover_roots
from inspector.scan.scanner import scan
from inspector.tui.session import build_tree, filter_kind, name_filter, preset_selection, selection_options


def test_tree_is_in_natural_order_with_subtotals(small_demo: Path) -> None:
    ckpt = scan(str(small_demo))
    tree = build_tree(ckpt.tensors)
    layers = tree.children["model"].children["layers"]
    keys = list(layers.children)
    assert keys == sorted(keys, key=int)  # 0, 1, 2, ... never 0, 1, 10, 2
    first = tree.children["model"]
    assert next(iter(first.children)) == "embed_tokens"  # model order, not alphabetical
    assert tree.count() == len(ckpt.tensors)
    assert layers.numel == sum(t.numel for t in ckpt.tensors if t.name.startswith("model.layers."))


def test_natural_order_for_ten_and_more() -> None:
    from inspector.scan.model import Kind, TensorInfo

    ts = [TensorInfo(f"layers.{i}.w", (1,), "float32", Kind.TRAINABLE, ()) for i in (10, 2, 1, 0, 11)]
    assert list(build_tree(ts).children["layers"].children) == ["0", "1", "2", "10", "11"]


def test_selection_is_converts_include_exclude(small_demo: Path) -> None:
    """Whatever is selected, the options built from it select exactly it under convert's own rules."""
    ckpt = scan(str(small_demo))
    names = [t.name for t in ckpt.tensors]
    rng = random.Random(7)
    cases = [set(names), {n for n in names if n.startswith("model.layers.1.")}, set(names) - {names[3]}]
    cases += [set(rng.sample(names, k)) for k in (1, 5, len(names) // 2, len(names) - 2)]
    for chosen in cases:
        opts = selection_options(ckpt, chosen, ConvertOptions())
        assert {t.name for t in select(ckpt, opts)} == chosen
        assert len(opts.include) + len(opts.exclude) <= len(names)


def test_whole_submodule_becomes_a_prefix(small_demo: Path) -> None:
    ckpt = scan(str(small_demo))
    chosen = {t.name for t in ckpt.tensors if t.name.startswith("model.layers.1.")}
    opts = selection_options(ckpt, chosen, ConvertOptions(dtype="bf16"))
    assert opts.include == ("model.layers.1",) and opts.exclude == ()
    assert opts.dtype == "bf16"


def test_preset_from_command_line_options(small_demo: Path) -> None:
    ckpt = scan(str(small_demo))
    chosen = preset_selection(ckpt, ConvertOptions(include=("model.layers.0",), exclude_frozen=True))
    assert chosen and all(n.startswith("model.layers.0.") for n in chosen)


@pytest.mark.parametrize(
    ("pattern", "hit", "miss"),
    [
        ("q_proj", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"),
        ("*.layers.1.*", "model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        (r"^model\.layers\.1\d\.", "model.layers.12.mlp.weight", "model.layers.1.mlp.weight"),
        # a character class inside a regex used to make the whole text a glob, matching nothing
        (
            r"^model\.layers\.[13]\.mlp",
            "model.layers.3.mlp.up_proj.weight",
            "model.layers.2.mlp.up_proj.weight",
        ),
        ("layers.[13].mlp", "model.layers.1.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"),
    ],
)
def test_filter_glob_regex_text(pattern: str, hit: str, miss: str) -> None:
    p = name_filter(pattern)
    assert p is not None and p.search(hit) and not p.search(miss)


@pytest.mark.parametrize(
    ("pattern", "mode"),
    [("q_proj", "text"), ("*.q_proj.*", "glob"), ("layers.[13]", "glob"), (r"^model\.layers\.[13]", "regex")],
)
def test_the_filter_says_how_it_read_the_text(pattern: str, mode: str) -> None:
    assert filter_kind(pattern) == mode


def test_bad_regex_is_an_error_not_a_crash() -> None:
    with pytest.raises(re.error):
        name_filter("(unclosed|")


def _roots(path: str) -> tuple[str, ...]:
    return discover_roots(path, source_at(path, "checkpoint"))


def test_discover_roots(tmp_path: Path, small_demo: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(small_demo, run / "_critic")
    os.symlink(small_demo, run / "_actor")
    (run / "logs").mkdir()
    assert _roots(str(run)) == (str(run / "_actor"), str(run / "_critic"))
    assert _roots(str(small_demo)) == (str(small_demo),)
    assert _roots(str(tmp_path / "run" / "logs")) == ()
    trainer = tmp_path / "trainer"
    for n in (10, 2):
        (trainer / f"checkpoint-{n}").mkdir(parents=True)
        os.symlink(small_demo / "global_step3", trainer / f"checkpoint-{n}" / "global_step3")
        (trainer / f"checkpoint-{n}" / "latest").write_text("global_step3")
    assert [os.path.basename(r) for r in _roots(str(trainer))] == ["checkpoint-2", "checkpoint-10"]


def test_a_folder_of_runs_opens_on_the_newest(tmp_path: Path) -> None:
    """#28 item 15: not the first name in order, the root saved last (Trainer's checkpoint-N by step)."""
    import time

    from inspector.tui.launch import newest_root

    roots = []
    for i, name in enumerate(("run-b", "run-a", "run-c")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "latest").write_text("global_step1")
        t = time.time() - 100 + (50 if name == "run-a" else i)
        os.utime(tmp_path / name / "latest", (t, t))
        roots.append(str(tmp_path / name))
    assert newest_root(tuple(roots)) == str(tmp_path / "run-a")
    steps = tuple(str(tmp_path / f"checkpoint-{n}") for n in (2, 10))
    assert newest_root(steps) == steps[-1]


def test_shard_sizes_are_shown_as_typed() -> None:
    """#28 item 15: `--shard-size 10KB` is 10KB on the form, not 10000."""
    from inspector.tui.screens.export_fields import human_size

    assert [human_size(n) for n in (10_000, 4096, 5 * 10**9, 2 * 2**30, 1234)] == [
        "10KB",
        "4KiB",
        "5GB",
        "2GiB",
        "1234",
    ]
