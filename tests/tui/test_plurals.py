"""Counts say "1 file" and "3 files", never "file(s)": the app's done line and meters, and every other line the
app and the CLI write, through the one plural helper (`system/units.plural`, re-exported by `tui/fmt`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from inspector.convert.events import Finished
from inspector.tui.jobs import done_text
from inspector.tui.widgets.progress import shard_rows

PACKAGE = Path(__file__).parents[2] / "inspector"
HEDGED = re.compile(r"[A-Za-z]\(s\)")  # `file(s)`, `error(s)`


def _hedged(tree: ast.AST) -> list[str]:
    """The string literals (f-strings' text parts included) that hedge a plural; docstrings may quote one."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and HEDGED.search(n.value)
    ]


def test_no_line_of_the_app_or_the_cli_hedges_a_plural() -> None:
    assert _hedged(ast.parse('f"{n} file(s) written"')) == [" file(s) written"]  # the rule can fail
    assert _hedged(ast.parse('def f():\n    """not 1 file(s)"""')) == []
    found = {}
    for face in ("tui", "cli"):
        for path in sorted((PACKAGE / face).rglob("*.py")):
            if hedged := _hedged(ast.parse(path.read_text(encoding="utf-8"))):
                found[path.relative_to(PACKAGE).as_posix()] = hedged
    assert not found


def test_the_done_line_and_the_meters_count_files_in_words() -> None:
    one = done_text(Finished("out", [["model.safetensors", 10]], 2, 10, 1.0, resumed_files=1), 0, 0).plain
    assert " in 1 file at " in one and "1 file reused from an earlier run" in one
    three = done_text(Finished("out", [["a", 1], ["b", 2], ["c", 3]], 3, 6, 1.0, resumed_files=3), 0, 0).plain
    assert " in 3 files at " in three and "3 files reused" in three
    assert "(s)" not in one + three
    files = [(f"model-{i:05d}-of-00012.safetensors", 1) for i in range(1, 13)]
    rows = shard_rows(files, current=3, fraction=0.5, rows=8).plain.splitlines()
    assert rows[0] == "  ✔ 1 earlier file written" and rows[-1] == "  · 5 more files to come"
