"""Text meant to be pasted into a shell (#38 C.1): `text.shell_command` quotes every argument so that bash
hands the program the original bytes, and the line itself never holds a raw control character (readline obeys
ESC and runs a line at each newline when a paste is not bracketed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector.text import ShellTextError, command_hint, shell_command, shell_quote
from tests.hostile_text import CONTROLS, raw_controls

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# every character a terminal obeys or that hides or reorders text, one of each: C0, DEL, C1, the Unicode
# line/paragraph separators and every format (bidi, zero-width) character, and each undecodable byte as
# os.fsdecode keeps it (a surrogate escape)
# (no NUL: no argv and no file name holds one)
UNSAFE = [chr(c) for c in range(1, 0x20)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]
UNSAFE += [chr(c) for c in range(0x2000, 0x2070) if unicodedata.category(chr(c)) in ("Cf", "Zl", "Zp")]
UNSAFE += [os.fsdecode(bytes([b])) for b in range(0x80, 0x100)]


def through_bash(args: list[str]) -> list[bytes]:
    """What bash hands `printf` for the quoted line: each argument's bytes."""
    line = shell_command(["printf", "%s\\0", *args])
    out = subprocess.run(["bash", "-c", line], capture_output=True, check=True).stdout
    return out.split(b"\0")[:-1]


def test_every_control_and_undecodable_byte_round_trips_and_is_never_raw() -> None:
    args = [f"a{c}b" for c in UNSAFE] + list(CONTROLS.values())[:-1]  # the lone surrogate: refused, below
    for a in args:
        assert not raw_controls(shell_quote(a)), ascii(a)
    assert through_bash(args) == [os.fsencode(a) for a in args]
    assert shell_quote("a\x00") == "$'a\\x00'"


def test_the_attack_names_paste_as_escapes() -> None:
    """A folder named `ck<ESC>#<LF>touch PWNED<LF>`: readline's ESC-# would comment out the line and run
    it, then `touch PWNED`. Quoted, the line is one line of printable ASCII, and bash gets the name back."""
    attack, undecodable = "ck\x1b#\ntouch PWNED\n", os.fsdecode(b"ck\xff\xfe")
    line = shell_command(["zero-inspector", "convert", attack, undecodable])
    assert line == "zero-inspector convert $'ck\\x1b#\\ntouch PWNED\\n' $'ck\\xff\\xfe'"
    assert line.isascii() and line.isprintable()
    assert through_bash([attack, undecodable]) == [attack.encode(), b"ck\xff\xfe"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
        min_size=1,
        max_size=4,
    )
)
def test_any_text_round_trips(args: list[str]) -> None:  # (no argv holds a NUL)
    for a in args:
        assert not raw_controls(shell_quote(a)), ascii(a)
    assert through_bash(args) == [a.encode() for a in args]


def test_quoting_is_as_plain_as_the_argument_allows() -> None:
    assert shell_quote("out/model-1.safetensors") == "out/model-1.safetensors"
    assert shell_quote("it's here") == "'it'\"'\"'s here'"
    assert shell_quote("$(touch x)`y`;z") == "'$(touch x)`y`;z'"
    assert shell_quote("a!b\n") == "$'a\\x21b\\n'"  # no history expansion inside `$'…'`


def test_a_lone_surrogate_that_stands_for_no_byte_is_refused() -> None:
    with pytest.raises(ShellTextError):
        shell_quote("a\ud800")
    assert command_hint("scan", "a\ud800") == "zero-inspector scan a\ud800"  # the exits escape it


def test_a_folder_names_newline_never_starts_a_line_of_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "ck\nFAKE: all good"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for argv in (["scan", str(folder)], ["convert", str(folder), str(tmp_path / "out")]):
        run = subprocess.run(
            [sys.executable, "-m", "inspector", *argv], capture_output=True, text=True, env=env
        )
        assert run.returncode == 2, run.stderr
        assert "ck\\nFAKE: all good" in run.stderr
        assert not any(line.startswith("FAKE") for line in run.stderr.splitlines()), run.stderr


def test_a_hint_names_a_command_as_the_shell_takes_it(tmp_path: Path) -> None:
    """A folder holding checkpoints: the hint's `zero-inspector scan …` pastes as the folder's name."""
    from inspector.cli.main import _with_roots_named
    from inspector.demo.spec import DemoSpec
    from inspector.demo.writer import write_demo
    from inspector.errors import NotACheckpointError

    run = tmp_path / "run\x1b]0;x\x07"
    write_demo(str(run / "checkpoint-1"), DemoSpec(params=1000))
    hint = _with_roots_named(NotACheckpointError("no"), str(run)).hint
    quoted = shell_quote(str(run / "checkpoint-1"))
    assert quoted.startswith("$'") and f"`zero-inspector scan {quoted}`" in hint
