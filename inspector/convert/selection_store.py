"""The user's named selections, kept between runs: one JSON file in the XDG state folder
(`$XDG_STATE_HOME/zero-inspector/selections.json`, else `~/.local/state/zero-inspector/`), per checkpoint
root (its resolved path), each name with the tag it was saved on and its tensor names.

The file is input like any other: read through a confined `Source` (regular file only, no link), bounded in
size, parsed into typed records; anything else in it (another program's file, a hand edit, a crafted one) is
ignored as a whole with a problem to show, never echoed, never a crash. It is written through an
`OutputRoot` (locked, atomic rename), read again under the lock so two apps saving at once keep both."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspector.convert.selections import NAME_LIMIT
from inspector.errors import InspectorError, InvalidOptionError, OutputError
from inspector.parse.names import name_problem

if TYPE_CHECKING:
    from inspector.convert.order import Order
    from inspector.scan.model import Checkpoint

FILE = "selections.json"
LOCK = ".selections.lock"
VERSION = 1
MAX_BYTES = 8 << 20  # the whole file: a few thousand tensor names per selection, many roots
MAX_ROOTS = 64  # checkpoints remembered; the least recently saved one is dropped first
MAX_NAMES = 64  # selections per checkpoint
MAX_TENSORS = 1 << 17  # tensor names in one selection
MAX_ROOT_CHARS = 4096  # a path (PATH_MAX) or a store URL


@dataclass(frozen=True)
class Saved:
    """One saved selection: the tag it was saved on (another tag offers it too, narrowed) and its tensors."""

    tag: str
    tensors: frozenset[str]


Roots = dict[str, dict[str, Saved]]  # root key -> name -> saved, both in the order they were saved


def state_folder() -> str:
    """Where the app keeps state: `$XDG_STATE_HOME` when it is an absolute path (the spec ignores a relative
    one), else `~/.local/state`, and `zero-inspector` below it."""
    base = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "zero-inspector")


def root_key(root: str) -> str:
    """A checkpoint root as the file keys it: a local path with its links resolved (the same checkpoint
    opened by two paths is one entry); a store URL as it is."""
    return root if "://" in root else os.path.realpath(os.path.expanduser(root))


class StateFileProblem(InspectorError):
    """The state file could not be used; the selections start empty (the file is left as it is)."""

    title = "Saved selections ignored"


def load(folder: str | None = None) -> Roots:
    """Every saved selection, or {} when there is no file yet; StateFileProblem for one that is not ours
    (too large, not JSON, a link, a field of the wrong type), naming the file, never its content."""
    from inspector.system.source import Source

    folder = folder or state_folder()
    path = os.path.join(folder, FILE)
    if not os.path.lexists(path):
        return {}
    try:
        doc = Source.at(folder, "state folder").read_json(FILE, MAX_BYTES, "saved-selections file")
        return _typed(doc)
    except InspectorError as exc:
        raise _problem(path, exc.message) from None
    except ValueError as exc:
        raise _problem(path, str(exc)) from None


def _problem(path: str, why: str) -> StateFileProblem:
    from inspector.text import shown

    return StateFileProblem(
        f"{shown(path)} was not read: {why}",
        hint="Your saved selections start empty; saving one with `m` writes a new file in its place.",
    )


def _typed(doc: Any) -> Roots:
    """The parsed document as typed records; ValueError naming the field that is wrong."""
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("roots"), dict):
        raise ValueError(f"it is not a version-{VERSION} saved-selections file")
    roots = doc["roots"]
    if len(roots) > MAX_ROOTS:
        raise ValueError(f"it lists more than {MAX_ROOTS} checkpoints")
    out: Roots = {}
    for key, names in roots.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_ROOT_CHARS or not key.isprintable():
            raise ValueError("a checkpoint's key is not a path")
        if not isinstance(names, dict) or len(names) > MAX_NAMES:
            raise ValueError(f"a checkpoint's entry is not up to {MAX_NAMES} named selections")
        out[key] = {_name(n): _saved(v) for n, v in names.items()}
    return out


def _name(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= NAME_LIMIT or not name.isprintable():
        raise ValueError("a selection's name is not a short printable text")
    return name


def _saved(entry: Any) -> Saved:
    if not isinstance(entry, dict) or set(entry) != {"tag", "tensors"}:
        raise ValueError("a selection is not a tag and its tensors")
    tag, tensors = entry["tag"], entry["tensors"]
    if not isinstance(tag, str) or (tag and name_problem(tag)):
        raise ValueError("a selection's tag is not a tag name")
    if not isinstance(tensors, list) or not 0 < len(tensors) <= MAX_TENSORS:
        raise ValueError(f"a selection does not list 1 to {MAX_TENSORS:,} tensors")
    if any(not isinstance(t, str) or name_problem(t) for t in tensors):
        raise ValueError("a selection lists something that is not a tensor name")
    return Saved(tag, frozenset(tensors))


def save(root: str, name: str, tag: str, tensors: frozenset[str], folder: str | None = None) -> Roots:
    """Add (or replace) one selection for `root` and write the file; returns what the file now holds.
    A file that was not ours is replaced (`load` said so when it was read). OutputError when it cannot be
    written (no home, a read-only disk, another app saving this instant)."""
    return _change(root, folder, lambda mine: {**{k: v for k, v in mine.items() if k != name},
                                               name: Saved(tag, tensors)})  # fmt: skip


def forget(root: str, name: str, folder: str | None = None) -> Roots:
    """Remove one selection of `root` and write the file; returns what the file now holds."""
    return _change(root, folder, lambda mine: {k: v for k, v in mine.items() if k != name})


def _change(root: str, folder: str | None, edit: Any) -> Roots:
    from inspector.convert.root import OutputRoot

    folder = folder or state_folder()
    key = root_key(root)
    with OutputRoot(folder, lock_name=LOCK) as out:
        try:
            roots = load(folder)
        except StateFileProblem:
            roots = {}
        mine = edit(roots.pop(key, {}))
        if len(mine) > MAX_NAMES:
            raise OutputError(
                f"At most {MAX_NAMES} selections are kept per checkpoint.",
                hint="Remove one you no longer need (d in the picker) and save again.",
            )
        if mine:
            roots[key] = mine  # the most recently saved root last: the oldest go first
        while len(roots) > MAX_ROOTS:
            roots.pop(next(iter(roots)))
        data = json.dumps(_document(roots), indent=1).encode()
        if len(data) > MAX_BYTES:
            raise OutputError(
                "The saved selections would grow past "
                f"{MAX_BYTES >> 20} MiB; this one was not saved.",
                hint="Remove selections you no longer need (d in the picker) and save again.",
            )
        out.write_atomic(FILE, data, fsync=True)
    return roots


def _document(roots: Mapping[str, Mapping[str, Saved]]) -> dict[str, Any]:
    return {
        "version": VERSION,
        "roots": {
            key: {n: {"tag": s.tag, "tensors": sorted(s.tensors)} for n, s in names.items()}
            for key, names in roots.items()
        },
    }


def of_root(roots: Roots, root: str) -> dict[str, frozenset[str]]:
    """The selections saved for `root`, name -> tensors, in the order they were saved."""
    return {n: s.tensors for n, s in roots.get(root_key(root), {}).items()}


def narrowed(order: Order, name: str, ckpt: Checkpoint) -> Order:
    """`convert --selection NAME` (and `preflight`): the order with exactly the tensors `name` selects in
    `ckpt`, the checkpoint it names as the command scanned it (once: the plan reads the same one), a proposed
    selection or one saved in the app, as convert's include list. The app's picker resolves names through the
    same `choices`, so both faces export the same tensors."""
    from dataclasses import replace

    from inspector.convert.cover import selection_options
    from inspector.convert.options import select
    from inspector.convert.selections import choices, resolve
    from inspector.text import quoted

    opts = order.request.options
    if opts.include or opts.exclude:
        raise InvalidOptionError(
            "--selection and --include/--exclude both choose the tensors.", hint="Use one of them."
        )
    problem: StateFileProblem | None = None
    try:
        saved = of_root(load(), ckpt.root)
    except StateFileProblem as exc:
        saved, problem = {}, exc
    try:
        chosen = resolve(name, choices(ckpt, saved)).tensors
    except InvalidOptionError:
        if problem is not None:  # it may have been saved there: say why it could not be read
            raise problem from None
        raise
    exact = selection_options(ckpt, set(chosen), opts)  # the app's own rule: the same options, the same bytes
    if {t.name for t in select(ckpt, replace(exact, exclude_frozen=False, exclude_buffers=False))} != chosen:
        raise InvalidOptionError(  # a name with glob characters (`*`, `?`, `[`) would select others too
            f"The selection {quoted(name)} holds tensor names that --include reads as patterns.",
            hint="Export it from the app (p, then e), which writes exactly its tensors.",
        )
    return replace(order, request=replace(order.request, options=exact))
