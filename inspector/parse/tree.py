"""Typed reading of an unpickled tree: every value is taken with the type, sign and size it must have, and
anything else is refused as one `InputError` naming the file and the field path.

The records in `parse/states.py` and `parse/universal.py` are built with these accessors and nothing else,
so no code past the parse layer handles a raw pickle value (`Any`) again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from inspector.errors import InputError
from inspector.format.torchzip import TensorRef
from inspector.parse.names import check_name, known_names

MAX_DIMS = 64
MAX_NUMEL = 1 << 48  # 281 trillion elements: larger than any model, small enough for int64 byte offsets
MAX_TEXT = 4096
JSON_DEPTH = 32
JSON_NODES = 100_000
T = TypeVar("T")


_MAPPING = (dict, Mapping)  # a dict (what pickles hold) told apart before the Mapping ABC's slower check


class Node:
    """A value read from `file`, at `path` inside it (`optimizer_state_dict.param_groups[1].lr`). A child's
    path is spelled only when asked (an error names it): a parse walks every entry of thousands of rank
    files, and formatting each one's path cost more than reading it."""

    __slots__ = ("_at", "file", "value")

    def __init__(self, value: Any, file: str, path: str | tuple[Node, Any] = "") -> None:
        self.value = value
        self.file = file
        self._at = path  # the path, or (parent, str key: `.key`; other: `[key]`) until spelled

    @property
    def path(self) -> str:
        at = self._at
        if type(at) is tuple:
            parent, key = at
            base = parent.path
            at = self._at = (f"{base}.{key}" if base else key) if type(key) is str else f"{base}[{key[0]!r}]"
        return at  # type: ignore[return-value]

    def fail(self, problem: str) -> InputError:
        return InputError(self.file, self.path or "the top level", problem)

    def _kind(self) -> str:
        v = self.value
        return "None" if v is None else type(v).__name__

    # -- containers ---------------------------------------------------------------------------------------

    def is_none(self) -> bool:
        return self.value is None

    def is_mapping(self) -> bool:
        return isinstance(self.value, _MAPPING)

    def at(self, key: str) -> Node:
        """The child under string key `key` (None when absent); the value itself must be a mapping."""
        if not isinstance(self.value, _MAPPING):
            raise self.fail(f"is a {self._kind()}, not a dict")
        return Node(self.value.get(key), self.file, (self, key))

    def has(self, key: str) -> bool:
        return isinstance(self.value, _MAPPING) and key in self.value

    def entries(self, what: str = "entry", *, names: bool = True) -> list[tuple[str, Node]]:
        """A dict's items in order, keys checked by the name rule (`what` says what the keys are)."""
        if not isinstance(self.value, _MAPPING):
            raise self.fail(f"is a {self._kind()}, not a dict")
        out = []
        path = self.path if names else ""
        for key, value in self.value.items():
            if names:
                check_name(key, what, self.file, path)
            elif not isinstance(key, str):
                raise self.fail(f"has a {type(key).__name__} key where names are expected")
            out.append((key, Node(value, self.file, (self, (key,)))))
        return out

    def names(self, what: str = "entry") -> None:
        """A dict's keys checked by the name rule, as `entries` checks them, its values not looked at."""
        if not isinstance(self.value, _MAPPING):
            raise self.fail(f"is a {self._kind()}, not a dict")
        if known_names(self.value.keys()):
            return
        path = self.path
        for key in self.value:
            check_name(key, what, self.file, path)

    def items_any(self) -> list[tuple[Any, Node]]:
        """A dict's items with keys of any hashable type (an optimizer's `state` is keyed by ints)."""
        if not isinstance(self.value, _MAPPING):
            raise self.fail(f"is a {self._kind()}, not a dict")
        return [(k, Node(v, self.file, (self, (k,)))) for k, v in self.value.items()]

    def seq(self, max_len: int = 1 << 24) -> list[Node]:
        """A list or tuple, as children."""
        if not isinstance(self.value, list | tuple):
            raise self.fail(f"is a {self._kind()}, not a list")
        if len(self.value) > max_len:
            raise self.fail(f"has {len(self.value):,} entries, more than {max_len:,}")
        return [Node(v, self.file, (self, (i,))) for i, v in enumerate(self.value)]

    # -- scalars --------------------------------------------------------------------------------------------

    def integer(self, lo: int | None = 0, hi: int | None = MAX_NUMEL) -> int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"is a {self._kind()}, not a whole number")
        if lo is not None and v < lo:
            raise self.fail(f"is {v if abs(v) < 1 << 63 else 'a huge negative number'}, below {lo}")
        if hi is not None and v > hi:
            raise self.fail(f"is larger than {hi:,}")
        return int(v)

    def opt_integer(self, lo: int | None = 0, hi: int | None = MAX_NUMEL) -> int | None:
        return None if self.value is None else self.integer(lo, hi)

    def number(self) -> float:
        """A finite real number (int or float)."""
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(f"is a {self._kind()}, not a number")
        try:
            f = float(v)
        except OverflowError:
            raise self.fail("is a number too large for a float") from None
        if not math.isfinite(f):
            raise self.fail("is not finite")
        return f

    def text(self, max_len: int = MAX_TEXT) -> str:
        v = self.value
        if not isinstance(v, str):
            raise self.fail(f"is a {self._kind()}, not text")
        if len(v) > max_len:
            raise self.fail(f"is {len(v):,} characters long, more than {max_len:,}")
        return v

    def name(self, what: str) -> str:
        return check_name(self.value, what, self.file, self.path)

    def flag(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.fail(f"is a {self._kind()}, not true/false")
        return self.value

    # -- tensors and shapes -------------------------------------------------------------------------------

    def tensor(self) -> TensorRef:
        if not isinstance(self.value, TensorRef):
            raise self.fail(f"is a {self._kind()}, not a tensor")
        return self.value

    def shape(self) -> tuple[int, ...]:
        """A tensor shape: a torch.Size, tuple or list of non-negative ints with a bounded element count."""
        v = self.value
        if not isinstance(v, list | tuple):
            raise self.fail(f"is a {self._kind()}, not a shape")
        if len(v) > MAX_DIMS:
            raise self.fail(f"has {len(v)} dimensions, more than {MAX_DIMS}")
        if all(type(d) is int and 0 <= d <= MAX_NUMEL for d in v):  # what real files hold: no Node per dim
            dims = tuple(v)
        else:
            dims = tuple(Node(d, self.file, (self, (i,))).integer(0, MAX_NUMEL) for i, d in enumerate(v))
        if math.prod(dims) > MAX_NUMEL:
            raise self.fail(f"describes {math.prod(dims):,} elements, more than any model holds")
        return dims

    # -- free-form metadata ---------------------------------------------------------------------------------

    def json(self) -> Any:
        """Free-form metadata (a DeepSpeed config, hyperparameters) as plain JSON-safe data: str keys, finite
        numbers, bounded depth and size; tensors and other objects become short descriptions."""
        budget = [JSON_NODES]
        return _json(self.value, 0, budget, self)


def _json(v: Any, depth: int, budget: list[int], node: Node) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > JSON_DEPTH:
        raise node.fail("is too large or too deeply nested for metadata")
    if v is None or isinstance(v, bool | str):
        return v if not isinstance(v, str) or len(v) <= MAX_TEXT else v[:MAX_TEXT]
    if isinstance(v, int):
        return int(v) if abs(v) < 1 << 63 else f"<a {v.bit_length()}-bit integer>"
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, Mapping):
        return {str(k)[:256]: _json(x, depth + 1, budget, node) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json(x, depth + 1, budget, node) for x in v]
    if isinstance(v, TensorRef):
        return f"tensor({v.dtype}, {list(v.shape)})"
    return type(v).__name__


_READ: dict[tuple[Callable[..., Any], int], tuple[Any, Any]] = {}  # (reader, id(value)) -> (value, record)
_READ_MAX = 64


def once(read: Callable[[Node], T], node: Node | None) -> T:
    """`read(node)`, or what `read` gave for this very object before. The rank trees one pickle rebuilds
    (format/replay.py) share their tensor-free sub-trees (config, shapes, hyperparameters), which every rank's
    parse would read again. Keyed by identity with the object kept alive beside its record, so an id is never
    reused; only a success is kept (a refusal is raised again, naming its own file); trees are never
    changed once loaded. For readers whose record names no file."""
    value = node.value if node is not None else None
    if value is None or node is None or not isinstance(value, dict | list | tuple):
        return read(node)  # type: ignore[arg-type]
    key = (read, id(value))
    hit = _READ.get(key)
    if hit is not None and hit[0] is value:
        return hit[1]  # type: ignore[no-any-return]
    record = read(node)
    if len(_READ) >= _READ_MAX:
        _READ.pop(next(iter(_READ)), None)
    _READ[key] = (value, record)
    return record
