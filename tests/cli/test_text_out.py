"""Text out, through every command: a checkpoint whose folder name, config.json values and asked-for tag hold
every class of terminal control (C0, ESC/CSI/OSC, C1, bidi, zero-width, separators) and Rich markup reaches
stdout and stderr with none of them raw, and no secret of the environment or of a URL is ever printed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspector.cli.main import main
from inspector.demo.writer import DemoSpec, write_demo
from tests.hostile_text import CONTROLS, raw_controls

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)
MARKUP = ("[bold red]", "[link=https://x]", "[/]", "[@click=app.quit]")


def raw(text: str) -> list[str]:
    """Characters a terminal would obey or that hide text, other than the newlines between lines."""
    return sorted(set(map(repr, raw_controls(text, newlines=True))))


@contextlib.contextmanager
def wide_terminal() -> Iterator[None]:
    old = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "TERM")}
    os.environ.update(COLUMNS="300", NO_COLOR="1", TERM="dumb")
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(*argv: str | Path) -> tuple[int, str]:
    """One command in this process (a fresh interpreter per command would make a property test crawl):
    exit code and stdout + stderr together."""
    out, err = io.StringIO(), io.StringIO()
    with wide_terminal(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([os.fspath(a) for a in argv])
    return rc, out.getvalue() + err.getvalue()


def every_command(root: Path, work: Path, tag: str) -> Iterator[tuple[str, int, str]]:
    """scan (tables, --tensors, --json), preflight (tables, --json), convert (rich and --progress json),
    verify (both), health (tables and --json), and a tag that is not there."""
    out_a, out_b = work / "out-a", work / "out-b"
    for argv in (
        ("scan", root),
        ("scan", root, "--tensors"),
        ("scan", root, "--json"),
        ("preflight", root, "--out", work),
        ("preflight", root, "--out", work, "--json"),
        ("convert", root, out_a, "--format", "model"),
        ("convert", root, out_b, "--format", "model", "--progress", "json"),
        ("verify", root, out_a),
        ("verify", root, out_b, "--progress", "json"),
        ("health", root),
        ("health", root, "--json"),
        ("scan", root, "--tag", tag),
        ("convert", root, work / "out-c", "--tag", tag, "--progress", "json"),
    ):
        rc, text = run(*argv)
        yield " ".join(map(str, argv[:1] + argv[2:])), rc, text
    shutil.rmtree(out_a, ignore_errors=True)
    shutil.rmtree(out_b, ignore_errors=True)


hostile_piece = st.sampled_from([*CONTROLS.values(), *MARKUP, "\n"])
hostile = st.lists(st.one_of(hostile_piece, st.text("ab_", min_size=1, max_size=3)), min_size=1, max_size=4).map(
    "".join
)
folder_name = hostile.map(lambda s: s.replace("/", "").replace("\x00", "").replace("\ud800", "") or "x").filter(
    lambda s: s not in (".", "..") and len(s.encode()) < 200
)


def hostile_checkpoint(base: Path, demo_root: Path, folder: str, dtype: str, base_model: str) -> Path:
    """A copy of the demo in a folder named `folder`, with a Trainer config.json holding hostile values."""
    root = base / folder
    shutil.copytree(demo_root, root, symlinks=True)
    (root / "config.json").write_text(
        json.dumps({"model_type": "llama", "torch_dtype": dtype, "base_model_name_or_path": base_model, dtype: 1})
    )
    return root


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("text-out-demo")
    write_demo(str(root), SPEC)
    return root


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(folder=folder_name, dtype=hostile, base_model=hostile, tag=hostile)
def test_no_raw_control_reaches_the_terminal_from_any_command(
    demo_root: Path, tmp_path_factory: pytest.TempPathFactory, folder: str, dtype: str, base_model: str, tag: str
) -> None:
    work = tmp_path_factory.mktemp("text-out")
    root = hostile_checkpoint(work, demo_root, folder, dtype, base_model)
    for what, rc, text in every_command(root, work, tag.replace("\x00", "") or "x"):
        assert "Traceback" not in text, (what, text)
        assert not raw(text), (what, raw(text), text)
        if what.startswith(("scan", "preflight", "health")) and "--tag" not in what:
            assert rc in (0, 1), (what, text)
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_each_control_class_in_the_folder_name_and_torch_dtype(demo_root: Path, tmp_path: Path, name: str) -> None:
    """The two known misses, one control class at a time: convert's header line (the folder name) and its
    "config.json says …" note (torch_dtype) printed them raw."""
    control = CONTROLS[name].replace("\ud800", "\udc00")
    folder = "ck" + control.replace("/", "") + "pt" if name != "lone surrogate" else "ckpt"
    root = hostile_checkpoint(tmp_path, demo_root, folder, "float16" + control, "base" + control)
    rc, text = run("convert", root, tmp_path / "out", "--format", "model")
    assert rc == 0, text
    assert "config.json says float16" in text and not raw(text), (raw(text), text)


def test_through_a_real_process(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """The same two misses as a user sees them: `python -m inspector` in a fresh interpreter."""
    root = hostile_checkpoint(
        tmp_path, demo(SPEC), "ck\x1b]0;PWNED\x07pt", "float16\x1b]52;c;aGVsbG8=\x07", "x\x1b[2J"
    )
    res = cli("convert", root, tmp_path / "out", "--format", "model")
    assert res.rc == 0 and not raw(res.output), res.output
    assert "ck\\x1b]0;PWNED\\x07pt" in res.output and "float16\\x1b]52;c;aGVsbG8=\\x07" in res.output


# --- secrets -------------------------------------------------------------------------------------------------


def test_a_password_in_the_endpoint_is_never_printed(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_ENDPOINT_URL with userinfo: the error (rich and --progress json) names the endpoint, never the
    password."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:pa55word-secret@127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-42")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    for argv in (
        ("scan", "s3://bucket/ckpt"),
        ("convert", demo(SPEC), "s3://bucket/out", "--progress", "json"),
        ("convert", "s3://bucket/ckpt", tmp_path / "out", "--progress", "json"),
    ):
        res = cli(*argv)
        assert res.rc != 0 and "Traceback" not in res.output, res.output
        assert "pa55word-secret" not in res.output and "aws-secret-value-42" not in res.output, res.output
        assert "127.0.0.1:1" in res.output, res.output  # where it went is still said
        if "json" in argv:
            events = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
            assert events and events[-1]["event"] == "error", res.stdout


def test_a_presigned_url_signature_is_never_echoed(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    url = "https://127.0.0.1:1/bucket/ckpt?X-Amz-Credential=AK%2F&X-Amz-Signature=deadbeefsignature42"
    for argv in (("scan", url), ("convert", url, tmp_path / "out", "--progress", "json")):
        res = cli(*argv)
        assert res.rc != 0 and "Traceback" not in res.output, res.output
        assert "deadbeefsignature42" not in res.output, res.output


def test_a_secret_in_a_url_fragment_is_never_printed(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """#38 C.2: `#api_key=…` in a URL's fragment (the checkpoint's, the endpoint's) was printed whole by scan,
    scan --json and convert --progress json, while the same in a query was hidden."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1/#access_key=endpoint-fragment-key42")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-42")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    url = "https://127.0.0.1:1/bucket/ckpt#api_key=url-fragment-secret42"
    for argv in (
        ("scan", "s3://bucket/ckpt"),
        ("scan", "s3://bucket/ckpt", "--json"),
        ("convert", demo(SPEC), "s3://bucket/out", "--progress", "json"),
        ("scan", url),
        ("scan", url, "--json"),
        ("convert", url, tmp_path / "out", "--progress", "json"),
    ):
        res = cli(*argv)
        assert res.rc != 0 and "Traceback" not in res.output, res.output
        assert "fragment-key42" not in res.output and "fragment-secret42" not in res.output, res.output
        assert "127.0.0.1:1" in res.output, res.output  # where it went is still said


@pytest.mark.parametrize(
    "variable",
    ["AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_CLIENT_SECRET", "GOOGLE_BEARER_TOKEN", "HF_TOKEN"],
)
def test_a_credential_variable_echoed_by_a_message_is_redacted(
    demo_root: Path, tmp_path: Path, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store credential that ends up in a path, a name or a message (here: the checkpoint's folder name) is
    hidden by every exit: tables, JSON, JSON lines and errors."""
    value = f"cred-{variable.lower()}-0123"
    monkeypatch.setenv(variable, value)
    root = hostile_checkpoint(tmp_path, demo_root, f"run-{value}", "float32", "base")
    for argv in (
        ("scan", root),
        ("scan", root, "--json"),
        ("convert", root, tmp_path / "o1"),
        ("convert", root, tmp_path / "o2", "--progress", "json"),
        ("scan", root, "--tag", value),
        ("health", root, "--json"),
    ):
        _, text = run(*argv)
        assert value not in text, (argv, text)
        if argv[0] != "health" and "--progress" not in argv:  # those two never name the root folder
            assert "***" in text, (argv, text)


def test_usage_errors_echo_arguments_escaped(cli: Callable[..., CliResult]) -> None:
    """argparse's own messages repeat the argument given: through the same rule."""
    for argv in (("scan", "/nonexistent", "--bogus\x1b]0;T\x07"), ("convert", "/x", "/y", "--executor", "\x9b2J")):
        res = cli(*argv)
        assert res.rc == 2 and not raw(res.output), res.output
        assert "\\x1b]0;T\\x07" in res.output or "\\x9b2J" in res.output, res.output


def test_a_user_error_is_one_line_and_its_hint_the_next() -> None:
    """A name's newline inside a message (a crafted folder name) is escaped like any control: it cannot start a
    line that looks like the tool's own. The message is one line, the hint the next."""
    from inspector.cli.console import print_error
    from inspector.errors import InspectorError

    err = io.StringIO()
    with wide_terminal(), contextlib.redirect_stderr(err):
        print_error(InspectorError("first line\nsecond \x1b[2J line", hint="do\nthis", title="T\x07"))
    text = err.getvalue()
    assert text.splitlines() == ["T\\x07: first line\\nsecond \\x1b[2J line", "→ do\\nthis"], text
    assert not raw(text)
