"""The package's layers, enforced: who may import whom, no cycles, the core free of UI toolkits.

Every import statement of every module is read with `ast` (function-local imports included, since a lazy
import is still a dependency), so a rule cannot pass just because an import happens to be deferred.

    cli/  tui/          faces: each sits on the core, never on the other
    convert/            options, plan, reader, pipeline, engine, writers, verify, preflight
    scan/               locate, layout, model, scanner
    parse/              the input boundary's typed records and the one name rule
    format/             on-disk formats (zip, pickle, safetensors bytes)
    system/             the machine (memory limits, RSS, units) and the confined byte source
    errors              shared by all
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "inspector"

# layer -> inspector layers it must never import (the demo writer is a tool of its own on top of the core)
FORBIDDEN: dict[str, set[str]] = {
    "format": {"parse", "scan", "convert", "cli", "tui", "demo"},
    "system": {"format", "parse", "scan", "convert", "cli", "tui", "demo"},
    "parse": {"scan", "convert", "cli", "tui", "demo"},
    "scan": {"convert", "cli", "tui", "demo"},
    "convert": {"cli", "tui", "demo"},
    "demo": {"cli", "tui"},  # it casts with convert.cast, exactly as the converter does
    "cli": {"tui"},
    "tui": {"cli"},
}
UI_TOOLKITS = {"textual", "rich"}
FACES = {"cli", "tui"}
# The one sanctioned crossing: the console entry point opens the app when given a PATH, importing it lazily.
ENTRY_EXCEPTIONS = {("cli.main", "tui")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts) or "__init__"] = path
    return out


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute module names imported by a file (`inspector.` prefix kept; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.relative_to(PKG.parent).with_suffix("").parts[: -node.level]
                mod = ".".join((*base, node.module)) if node.module else ".".join(base)
            else:
                mod = node.module or ""
            found.add(mod)
            if mod in {"inspector"} | {f"inspector.{p}" for p in FORBIDDEN}:  # `from inspector.x import y`
                found.update(f"{mod}.{alias.name}" for alias in node.names)
    return found


def _layer(module: str) -> str:
    return module.split(".")[0]


def test_the_probe_sees_the_package() -> None:
    """Guards every rule below against passing on an empty or unparsed tree."""
    mods = _modules()
    assert {"scan.scanner", "convert.engine", "format.torchzip", "cli.main"} <= set(mods)
    assert "inspector.scan.model" in _imports(mods["scan.scanner"])


@pytest.mark.parametrize("module", sorted(_modules()))
def test_layer_rules(module: str) -> None:
    path = _modules()[module]
    layer = _layer(module)
    bad = []
    for imp in _imports(path):
        head = imp.split(".")[0]
        if head in UI_TOOLKITS and layer not in FACES:
            bad.append(f"{imp} (the core never imports a UI toolkit)")
        if head == "inspector" and "." in imp:
            target = imp.split(".")[1]
            if target in FORBIDDEN.get(layer, set()) and (module, target) not in ENTRY_EXCEPTIONS:
                bad.append(f"{imp} ({layer}/ must not depend on {target}/)")
    assert not bad, f"inspector/{module.replace('.', '/')}: " + "; ".join(bad)


def test_no_import_cycles() -> None:
    """Module-level imports form a DAG (function-local imports are how a face defers cost, not cycles)."""
    mods = _modules()
    graph = {
        m: {i.removeprefix("inspector.") for i in _imports(p, top_level_only=True) if i.startswith("inspector.")}
        & set(mods)
        for m, p in mods.items()
    }
    assert sum(map(len, graph.values())) > 20, "the import graph is suspiciously empty"
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
