"""The package's layers, enforced: who may import whom, no cycles, the core free of UI toolkits.

Every import statement of every module is read with `ast` (function-local imports included, since a lazy
import is still a dependency), so a rule cannot pass just because an import happens to be deferred.

    cli/  tui/          faces: each sits on the core, never on the other
    faces/              what both faces draw alike (Rich): under both faces, on the core, never on a face
    convert/            options, plan, reader, pipeline, executor, kinds, writers, verify, preflight
    scan/               locate, layout, model, scanner
    parse/              the input boundary's typed records and the one name rule
    format/             on-disk formats (zip, pickle, safetensors bytes)
    remote/             object-store byte sources and destinations, and `remote/roots`, the one place a
                        root the user named becomes a local or a store source; it applies the one name
                        rule (parse/names) and sits on system/, never the reverse
    system/             the machine (memory limits, RSS, units), the byte-source protocol and the
                        confined local folder (system/source); it never imports remote/
    errors              shared by all
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "inspector"

# layer -> inspector layers it must never import (the demo writer is a tool of its own on top of the core)
_EVERY_LAYER = {"system", "remote", "format", "parse", "scan", "convert", "health", "demo"}
_EVERY_LAYER |= {"faces", "cli", "tui"}
FORBIDDEN: dict[str, set[str]] = {
    # the ground: the text-out rule imports nothing of ours, and the error types only it
    "text": _EVERY_LAYER | {"errors"},
    "errors": _EVERY_LAYER,
    "format": {"parse", "scan", "convert", "faces", "cli", "tui", "demo", "health"},
    # the bottom layer: the local source and the protocol; which kind of source a root is, is decided above it
    # (remote/roots), so no arrow goes from system/ back up to remote/
    "system": {"remote", "format", "parse", "scan", "convert", "faces", "cli", "tui", "demo", "health"},
    # the object-store byte sources, on top of system/; of parse/ only the name rule
    "remote": {"format", "scan", "convert", "faces", "cli", "tui", "demo", "health"},
    "parse": {"scan", "convert", "faces", "cli", "tui", "demo", "health"},
    "scan": {"convert", "faces", "cli", "tui", "demo", "health"},
    "convert": {"faces", "cli", "tui", "demo", "health"},
    # health reads through convert's reader and casts; the faces sit on it
    "health": {"faces", "cli", "tui", "demo"},
    "demo": {"faces", "cli", "tui"},  # it casts with convert.cast, exactly as the converter does
    "cli": {"tui"},
    "tui": {"cli"},
    "faces": {"cli", "tui"},  # drawn alike for both, so it knows neither
}
# humanize too: words for people are the faces' (sizes and counts the JSON and both faces share are units.py's)
UI_TOOLKITS = {"textual", "rich", "humanize"}
FACES = {"cli", "tui", "faces"}
# The one sanctioned crossing: the console entry point opens the app when given a PATH, importing it lazily.
ENTRY_EXCEPTIONS = {("cli.launch", "tui")}  # `open` starts the app: the one place a face reaches the other


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
    assert {"scan.scanner", "convert.executor", "format.torchzip", "cli.main"} <= set(mods)
    assert "inspector.scan.model" in _imports(mods["scan.scanner"])


@pytest.mark.parametrize("module", sorted(_modules()))
def test_layer_rules(module: str) -> None:
    path = _modules()[module]
    layer = _layer(module)
    bad = []
    for imp in _imports(path):
        head = imp.split(".")[0]
        if head in UI_TOOLKITS and layer not in FACES:
            bad.append(f"{imp} (the core never imports a face's library)")
        if head == "inspector" and "." in imp:
            target = imp.split(".")[1]
            if target in FORBIDDEN.get(layer, set()) and (module, target) not in ENTRY_EXCEPTIONS:
                bad.append(f"{imp} ({layer}/ must not depend on {target}/)")
    assert not bad, f"inspector/{module.replace('.', '/')}: " + "; ".join(bad)


def test_remote_takes_only_the_name_rule_from_parse() -> None:
    """remote/ sits on system/, below format/: the one name rule is all it may take from parse/, and that
    rule depends on nothing but the errors and the text-out rule (text.py, which imports nothing of
    ours), so remote/ reaches no higher layer."""
    mods = _modules()
    remote = [m for m in mods if _layer(m) == "remote"]
    assert "remote.s3" in remote
    for m in remote:
        from_parse = {i for i in _imports(mods[m]) if i.startswith("inspector.parse")}
        assert from_parse <= {"inspector.parse.names", "inspector.parse.names.name_problem"}, (m, from_parse)
    deps = {i.split(".")[1] for i in _imports(mods["parse.names"]) if i.startswith("inspector.")}
    deps |= {i.split(".")[1] for i in _imports(mods["errors"]) if i.startswith("inspector.")}
    assert deps <= {"errors", "text"}, deps  # text: the text-out rule, which imports nothing of ours
    assert not {i for i in _imports(mods["text"]) if i.startswith("inspector.")}


def test_system_never_reaches_up_to_remote() -> None:
    """The byte source is chosen above system/ (remote/roots) and passed down; system/ asks no path string
    whether it is a URL's and never imports remote/ to answer, not even lazily (the layer rule reads lazy
    imports too; this names the rule so it cannot be dropped from FORBIDDEN unnoticed)."""
    mods = _modules()
    assert "remote" in FORBIDDEN["system"]
    system = [m for m in mods if _layer(m) == "system"]
    assert "system.bytesource" in system
    for m in system:
        assert not [i for i in _imports(mods[m]) if i.startswith("inspector.remote")], m


def test_the_tree_reads_the_placement_not_the_scans_words() -> None:
    """The app's tensor tree learns who holds each expert and pipeline layer from the scan's structured rows
    (`Parallel.placement`), never by matching the overview's wording (`Parallel.holders`) with patterns: a
    change of wording must not change what the tree believes."""
    mods = _modules()
    assert "re" in _imports(mods["scan.layouts.pipeline"]), "the probe must see a plain `import re`"
    path = mods["tui.holders"]
    assert not {i for i in _imports(path) if i.split(".")[0] in {"re", "fnmatch", "parse"}}
    words = [
        n.lineno
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Attribute) and n.attr == "holders"
    ]
    assert not words, f"inspector/tui/holders.py reads Parallel.holders (the words) at lines {words}"
    kinds = [
        n.lineno
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Attribute) and n.attr == "kind"
    ]
    assert not kinds, f"inspector/tui/holders.py branches on the layout's kind at lines {kinds}"


def _layout_packages() -> set[str]:
    """The layouts' packages and modules under scan/layouts/ (all but the registry and the protocol)."""
    folder = PKG / "scan" / "layouts"
    return {p.stem if p.is_file() else p.name for p in folder.iterdir() if p.name not in {"__init__.py", "base.py"}}


def _reached_layouts(path: Path) -> set[str]:
    """Which layouts' modules a file imports: `inspector.scan.layouts.<layout>[...]`, also as
    `from inspector.scan.layouts import <layout>` or `from inspector.scan import layouts` + attribute."""
    layouts = _layout_packages()
    reached = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:3] == ["inspector", "scan", "layouts"] and len(parts) > 3 and parts[3] in layouts:
                reached.add(parts[3])
    return reached


def test_the_probe_sees_every_layout() -> None:
    assert {"zero", "pipeline", "moe", "autoep", "tensor", "universal"} <= _layout_packages()
    assert _reached_layouts(PKG / "scan" / "layouts" / "__init__.py") >= {"zero", "pipeline", "universal"}


@pytest.mark.parametrize("module", sorted(m for m in _modules() if not m.startswith("scan.layouts")))
def test_only_the_registry_knows_a_layout(module: str) -> None:
    """Outside scan/layouts/, code reaches the layouts through the registry (`inspector.scan.layouts`: LAYOUTS)
    and the protocol (`layouts/base.py`), never one layout's module: a new layout is one folder and one
    registry line, and nothing after the scan depends on which layout read the checkpoint."""
    reached = _reached_layouts(_modules()[module])
    assert not reached, f"inspector/{module.replace('.', '/')} imports the layout(s) {sorted(reached)}"


def test_no_import_cycles() -> None:
    """Module-level imports form a DAG (function-local imports are how a face defers cost, not cycles)."""
    mods = _modules()
    graph = {
        m: {
            i.removeprefix("inspector.")
            for i in _imports(p, top_level_only=True)
            if i.startswith("inspector.")
        }
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


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module -> modules it imports), or [] when it is a DAG."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_import_cycles_counting_every_import() -> None:
    """No circle even counting `if TYPE_CHECKING:` and function-local imports: a circle of type-only or lazy
    imports still makes two modules one unit (each needs the other to be read or checked); deferring an import
    into a function hides a circle from the rule above without removing it."""
    mods = _modules()
    graph = {
        m: {i.removeprefix("inspector.") for i in _imports(p) if i.startswith("inspector.")} & set(mods)
        for m, p in mods.items()
    }
    assert "tui.screens.main" in graph["tui.app"], "the probe must see function-local imports"
    assert "tui.shell" in graph["tui.typed"], "the probe must see TYPE_CHECKING imports"
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_probe_finds_a_cycle() -> None:
    """Guards the rule above against a probe that never reports."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


# The output boundary: only the output root changes files. Calls that create, rename, copy or remove a file or
# folder, by name (module attribute or method), and `open` / `os.open` asking to create or write.
_FILE_CHANGING = {
    "os": {
        "replace",
        "rename",
        "renames",
        "makedirs",
        "mkdir",
        "unlink",
        "remove",
        "rmdir",
        "removedirs",
        "symlink",
        "link",
        "truncate",
        "mkfifo",
        "mknod",
    },
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "rmtree"},
    "tempfile": {"mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory"},
}
_PATH_METHODS = {"write_text", "write_bytes", "touch", "mkdir", "unlink", "rmdir", "rename", "replace"}
_CREATE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}
OUTPUT_ROOT = "convert.root"
# module -> why it may change files itself
WRITE_EXCEPTIONS = {
    "tui.app": "the app's own private scratch folder for `--demo` (mkdtemp, 0700), removed when the app exits",
    "cli.console": "stdout re-pointed at /dev/null once its reader closed the pipe (opens a device, creates nothing)",
}


def _file_changes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        where = f"line {node.lineno}"
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.attr in _FILE_CHANGING.get(f.value.id, set()):
                found.append(f"{f.value.id}.{f.attr} ({where})")
            if f.value.id == "os" and f.attr == "open" and len(node.args) > 1:
                flags = {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if flags & _CREATE_FLAGS:
                    found.append(f"os.open with {sorted(flags & _CREATE_FLAGS)} ({where})")
        elif isinstance(f, ast.Attribute) and f.attr in _PATH_METHODS and f.attr not in {"replace"}:
            found.append(f".{f.attr}() ({where})")
        elif isinstance(f, ast.Name) and f.id == "open":
            mode = (
                node.args[1]
                if len(node.args) > 1
                else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            if (
                isinstance(mode, ast.Constant)
                and isinstance(mode.value, str)
                and set(mode.value) & set("wax+")
            ):
                found.append(f"open(..., {mode.value!r}) ({where})")
    return found


def test_the_probe_sees_file_changes() -> None:
    """Guards the rule below: the output root itself is full of them."""
    assert len(_file_changes(_modules()[OUTPUT_ROOT])) >= 8


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m != OUTPUT_ROOT))
def test_only_the_output_root_changes_files(module: str) -> None:
    """Every file the tool creates, renames, copies or removes goes through `convert/root.py`: a new writer
    that opens its own files fails here, so it cannot start unprotected."""
    found = _file_changes(_modules()[module])
    if module in WRITE_EXCEPTIONS:
        assert found, f"{module} no longer changes files: drop its exception"
        return
    assert not found, f"inspector/{module.replace('.', '/')}.py changes files itself: " + "; ".join(found)


def _layout_name_tests(source: str) -> list[str]:
    """Where a module's source compares a layout's name with a string: `Parallel.kind` (`par.kind`, `x.parallel.kind`)
    or `Checkpoint.layout` in `==`, `!=`, `in`, `not in` with a string literal (or a tuple, list or set of
    them), or `.startswith` / `.endswith` called on one."""

    def named(node: ast.AST) -> bool:
        if not isinstance(node, ast.Attribute):
            return False
        if node.attr == "layout":
            return True
        base = node.value
        parallel = isinstance(base, ast.Name) and base.id in {"par", "parallel"}
        parallel |= isinstance(base, ast.Attribute) and base.attr == "parallel"
        return node.attr == "kind" and parallel

    def literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(literal(e) for e in node.elts)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) and any(literal(s) for s in sides):
                found.append(f"line {node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"startswith", "endswith"}
            and named(node.func.value)
        ):
            found.append(f"line {node.lineno}")
    return found


def test_the_name_probe_sees_a_name_test() -> None:
    """Guards the rule below against a probe that finds nothing."""
    code = (
        'a = ckpt.parallel.kind == "expert"\nb = par.kind not in ("tensor", "pipeline")\n'
        'c = ckpt.layout.startswith("dcp-")\nd = "x" == ckpt.layout\ne = t.kind == "buffer"\n'
    )
    assert _layout_name_tests(code) == ["line 1", "line 2", "line 3", "line 4"]


@pytest.mark.parametrize("module", sorted(m for m in _modules() if not m.startswith("scan.layouts")))
def test_nothing_after_the_scan_tests_a_layouts_name(module: str) -> None:
    """A kind, a face or a health check decides on the records the layout filled at scan (`Parallel.words`,
    `placement`, `tp_recipe`, `Checkpoint.universal`, `saved_by`), never on the layout's name: a new layout
    is one folder and one registry line, and nothing downstream learns its name."""
    found = _layout_name_tests(_modules()[module].read_text())
    assert not found, f"inspector/{module.replace('.', '/')}.py tests a layout's name at " + ", ".join(found)
