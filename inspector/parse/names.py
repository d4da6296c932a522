"""The one rule for names that come from a file: parameters, buffers, tied aliases, tags, `latest*`, folder
names of a multi-root run. Such a name is printed by both faces, becomes a safetensors key and, for universal
checkpoints, a folder under the output root, so it must be safe in all three places at once.
"""

from __future__ import annotations

from collections.abc import Collection

from inspector.errors import InputError
from inspector.text import has_unsafe, quoted

MAX_NAME_BYTES = 255  # a path component's limit on every common file system (universal: zero/<name>/)
RESERVED = frozenset({"__metadata__"})  # safetensors' header key; a tensor of that name makes the file unloadable


def name_problem(name: object) -> str:
    """Why `name` is not a safe name ("" when it is)."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if name in (".", ".."):
        return "is `.` or `..`"
    if "/" in name or "\\" in name:
        return "holds a path separator (`/` or `\\`)"
    if has_unsafe(name):  # the text-out rule's own character class (text.py)
        return "holds control characters (terminal escapes) or invisible formatting characters"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if name in RESERVED:
        return "is reserved (safetensors keeps its metadata under it)"
    return ""


_SAFE: set[str] = set()  # names that passed: every rank file of a save names the same parameters
_SAFE_MAX = 1 << 16  # a few MiB at most; cleared when full


def known_names(names: Collection[object]) -> bool:
    """Whether every one of `names` is a str that passed `check_name` already: a stage-3 rank's module names
    the same hundreds of parameters as every other rank's, tested here in one set operation."""
    return _SAFE.issuperset(names) and set(map(type, names)) <= {str}  # plain str, no subclass: one C pass


def check_name(name: object, what: str, file: str, field: str) -> str:
    """`name` itself if it is safe; otherwise the one input error, naming the file, the field and the name
    (escaped, cut to 80 characters)."""
    if type(name) is str and name in _SAFE:  # the verdict depends on the text alone
        return name
    problem = name_problem(name)
    if problem:
        show = quoted(name) if isinstance(name, str) else f"'{type(name).__name__}'"
        raise InputError(file, field, f"the {what} {show} {problem}")
    assert isinstance(name, str)
    if type(name) is str:
        if len(_SAFE) >= _SAFE_MAX:
            _SAFE.clear()
        _SAFE.add(name)
    return name
