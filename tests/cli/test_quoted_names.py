"""A name in a message is escaped once (`text.quoted`): `repr` of `shown` escaped its escapes again, so an
unknown `--selection` holding ESC read `'a\\\\x1bb'` and one holding a backslash `'a\\\\b'`, where the
parser's own usage errors show what was typed once. The rule is checked on every module (an AST walk), and
on the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from inspector.text import quoted
from tests.scan.layout_cases import ckpt_dir

PACKAGE = Path(__file__).parents[2] / "inspector"
# other engineers' folders this round (scan/, parse/): the same defect, left for the lead to fix at merge
# with `quoted` (see the report); remove an entry once its site is fixed (the test says when it is)
ELSEWHERE: dict[str, int] = {}


def _is_shown(node: ast.AST, names: set[str]) -> bool:
    """`shown(...)`, `shown(...)[:n]`, either side of `... if ... else ...`, or a name assigned one."""
    if isinstance(node, ast.IfExp):
        return _is_shown(node.body, names) or _is_shown(node.orelse, names)
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "shown"


def _twice_escaped(tree: ast.AST) -> int:
    """How many places `repr` (`!r`, `repr(...)`) is applied to text `shown` already escaped."""
    names = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_shown(node.value, set())
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue) and node.conversion == ord("r"):
            found += _is_shown(node.value, names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "repr":
            found += any(_is_shown(a, names) for a in node.args)
    return found


def test_no_module_quotes_a_name_with_repr_of_shown() -> None:
    assert _twice_escaped(ast.parse("f'{shown(x)!r} {shown(y)[:80]!r}'; repr(shown(z))")) == 3  # it can fail
    assert _twice_escaped(ast.parse("s = shown(x)[:80] if x else ''\nf'{s!r}'")) == 1
    assert _twice_escaped(ast.parse("f'{quoted(x)} {x!r}'")) == 0
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if n := _twice_escaped(ast.parse(path.read_text(encoding="utf-8"))):
            found[path.relative_to(PACKAGE).as_posix()] = n
    assert found == ELSEWHERE


def test_quoted_escapes_once_and_cuts() -> None:
    assert quoted("a\x1bb") == "'a\\x1bb'"  # ESC as its escape, one backslash
    assert quoted("a\\b") == "'a\\b'"  # a backslash stays one
    assert quoted("stage 1") == "'stage 1'"
    assert quoted("x" * 100) == "'" + "x" * 80 + "…'"
    assert quoted("x" * 100, None) == "'" + "x" * 100 + "'"


@pytest.mark.parametrize(
    ("name", "said"), [("a\\b", "'a\\b'"), ("a\x1bb", "'a\\x1bb'"), ("a\u202eb", "'a\\u202eb'")]
)
def test_an_unknown_selection_is_named_once_escaped(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, name: str, said: str
) -> None:
    from inspector.convert import selection_store as store

    path = ckpt_dir("pp_z1_bf16")
    store.save(str(path), "my\\heads", "global_step3", frozenset({"4.weight"}))  # a saved name, listed too
    for argv in (("convert", path, tmp_path / "out"), ("preflight", path)):
        r = cli(*argv, "--selection", name)
        assert r.rc != 0 and "Traceback" not in r.stderr
        assert f"No selection named {said} for this checkpoint." in r.stderr, r.stderr
        assert "'stage 0', 'stage 1', 'my\\heads'" in r.stderr, r.stderr
        assert "\\\\" not in r.stderr and "\x1b" not in r.stderr and "\u202e" not in r.stderr
    assert not (tmp_path / "out").exists()
