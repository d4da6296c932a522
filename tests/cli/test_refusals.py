"""Typed refusals for the small surfaces of #27: `--part` takes ASCII digits only, a config.json dtype of any
JSON type is named (never hashed or echoed), and a store scheme whose package is missing names that package.
Each with a fuzz run: any `--part` text, any JSON value in the Trainer and adapter side files' fields, zero
tracebacks and zero hangs (each case bounded by the test's timeout)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inspector.cli.main import main
from inspector.convert.order import parse_part
from inspector.convert.writers.hf_folder import config_dtype_fix
from inspector.demo.writer import DemoSpec, write_demo
from inspector.errors import InspectorError
from inspector.remote.roots import source_at
from tests.hostile_text import raw_controls

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)


# --- --part ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["²/3", "1/³", "١/٣", "１/３", "۱/۴", " 1/3", "1/3 ", "+1/3", "-1/3", "1_0/20", "0x1/3", "1/3/5", "3/3", "0/0",
     "1/100001", "", "/", "1/", "/3", "a/b", "1e3/5", "0 /3", "1\x1b[2J/3"],
)
def test_part_refuses_everything_but_ascii_i_of_n(text: str) -> None:
    with pytest.raises(InspectorError) as info:
        parse_part(text)
    assert info.value.exit_code == 2 and info.value.title == "Invalid option"
    assert not raw_controls(info.value.message)


@pytest.mark.parametrize(("text", "want"), [("0/3", (0, 3)), ("2/3", (2, 3)), ("099/100", (99, 100)), ("0/1", (0, 1))])
def test_part_takes_i_of_n(text: str, want: tuple[int, int]) -> None:
    assert parse_part(text) == want


@pytest.mark.timeout(120)
@given(st.text(max_size=12) | st.builds(lambda a, b: f"{a}/{b}", st.text(max_size=4), st.text(max_size=4)))
def test_part_fuzz_never_crashes(text: str) -> None:
    try:
        i, n = parse_part(text) or (0, 1)
    except InspectorError:
        return
    assert text.isascii() and f"{int(text.split('/')[0])}/{int(text.split('/')[1])}" == f"{i}/{n}" and 0 <= i < n


def test_part_with_a_superscript_is_a_usage_error(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    for extra in ((), ("--progress", "json")):
        res = cli("convert", demo(SPEC), tmp_path / "out", "--part", "²/3", *extra)
        assert res.rc == 2 and "Traceback" not in res.output and "is not I/N" in res.output, res.output


# --- a config.json dtype of any JSON type ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (["float16", "bfloat16"], "(a list, not a dtype name)"),
        ({"$ref": "float16"}, "(an object, not a dtype name)"),
        (16, "(a number, not a dtype name)"),
        (True, "(a boolean, not a dtype name)"),
        (None, "(null, not a dtype name)"),
        ("x" * 10_000, "x" * 40 + "…"),
    ],
    ids=["list", "dict", "number", "bool", "null", "10k-string"],
)
def test_torch_dtype_of_any_type_is_named_and_replaced(tmp_path: Path, value: Any, said: str) -> None:
    from inspector.convert.writers.hf_folder import SideFile

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": value, "dtype": value}))
    side = [SideFile("config.json", str(tmp_path / "config.json"), origin=source_at(str(tmp_path)))]
    out, note = config_dtype_fix(side, "bfloat16")
    assert note is not None and said in note and "the copy says bfloat16" in note
    assert json.loads(out[0].content or b"")["torch_dtype"] == "bfloat16"


def test_a_list_torch_dtype_converts_with_a_note(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": ["float16", {"a": 1}]}))
    res = cli("convert", root, tmp_path / "out", "--format", "model")
    assert res.rc == 0 and "Traceback" not in res.output, res.output
    assert "config.json says (a list, not a dtype name)" in res.output
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"


# --- a store scheme whose package is missing ---------------------------------------------------------------------


@pytest.mark.parametrize(("url", "package"), [("gcs://bucket/ckpt", "gcsfs"), ("sftp://host/ckpt", "paramiko")])
def test_a_missing_fsspec_client_names_its_package(url: str, package: str, cli: Callable[..., CliResult]) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    for argv in (("scan", url), ("health", url), ("convert", url, "/nonexistent-out", "--progress", "json")):
        res = cli(*argv)
        assert res.rc == 2 and "Traceback" not in res.output, res.output
        assert f"needs {package}, which is not installed" in res.output, res.output


# --- fuzz: Trainer and adapter side files --------------------------------------------------------------------------

JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
CONFIG_FIELDS = ("torch_dtype", "dtype", "model_type", "tie_word_embeddings", "architectures", "base_model_name_or_path")
ADAPTER_FIELDS = (
    "peft_type", "r", "lora_alpha", "target_modules", "modules_to_save", "rank_pattern", "alpha_pattern",
    "base_model_name_or_path", "use_rslora", "fan_in_fan_out", "bias", "task_type",
)


def _run(*argv: str | Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([os.fspath(a) for a in argv])
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def plain_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("side-fuzz-demo")
    write_demo(str(root), SPEC)
    return root


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(config={"torch_dtype": ["float16"], "dtype": {"a": 1}}, adapter={"r": [1], "target_modules": {"x": 2}})
@given(
    config=st.fixed_dictionaries({}, optional={k: JSON_VALUE for k in CONFIG_FIELDS}) | JSON_VALUE,
    adapter=st.fixed_dictionaries({}, optional={k: JSON_VALUE for k in ADAPTER_FIELDS}) | JSON_VALUE,
)
def test_side_file_fields_of_any_type_never_crash(
    plain_demo: Path, tmp_path_factory: pytest.TempPathFactory, config: Any, adapter: Any
) -> None:
    work = tmp_path_factory.mktemp("side-fuzz")
    root = work / "ckpt"
    shutil.copytree(plain_demo, root, symlinks=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "global_step3" / "adapter_config.json").write_text(json.dumps(adapter))
    (root / "adapter_config.json").write_text(json.dumps(adapter))
    for argv in (
        ("scan", root),
        ("scan", root, "--json"),
        ("preflight", root, "--out", work),
        ("convert", root, work / "model", "--format", "model"),
        ("convert", root, work / "adapter", "--format", "adapter", "--progress", "json"),
    ):
        rc, text = _run(*argv)  # anything but an InspectorError propagates and fails the test
        assert rc in (0, 1, 2), (argv, text)
        assert not raw_controls(text, newlines=True), (argv, text)
    shutil.rmtree(work, ignore_errors=True)
