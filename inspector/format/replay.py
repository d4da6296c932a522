"""A torch pickle seen before, rebuilt for another archive without unpickling it again.

Every rank of a save writes the same `data.pkl` (the same names, shapes, config and storage keys; only the
storages' bytes differ), so a 4,096-rank folder unpickled the same 7 KB thousands of times, most of it in
our Python callbacks per tensor. The tree of such bytes is the tree of the first archive with each tensor
pointing into the new archive's records instead. `Template` keeps the first tree and the storage requests
its unpickling made, in order; `rebuild` replays those requests against the new archive through the same
`TorchZip.storage` (the record exists, holds the bytes asked for, lies inside the file and clear of the
other records: every per-archive check the unpickling made) and copies only the containers on a path to a
tensor. That copy is a flat program made once per template (`_Program`: the tensors made in one pass, then
each carrying container, children first), not a walk of the tree per archive. What else a pickle decides (the guards' verdicts, each view's check, every other value) depends only
on its bytes, which are the same. A tree with a tensor anywhere else (inside a record, a set, with `attrs`)
gets no template and is unpickled every time.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from typing import Any

from inspector.format.dtypes import itemsize
from inspector.format.records import InertDict, Record, ZeroStage, _OrderedDict, _Token
from inspector.format.views import StorageRef, TensorRef
from inspector.format.zipreader import TorchZip

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), ZeroStage, _Token)


class _NoTemplate(Exception):
    """A tensor where a rebuild does not copy: this tree is unpickled every time."""


class Template:
    """One pickle's tree and the storages its unpickling asked the archive for, in order."""

    __slots__ = ("leans", "program", "requests", "tree")

    def __init__(self, tree: Any, requests: list[tuple[str, str, int]], carriers: set[int]) -> None:
        self.tree, self.requests = tree, requests
        self.program = _Program(tree, carriers)
        self.leans: dict[frozenset[str], _Program] = {}  # `program.lean(skip)`, made once per `skip`

    @classmethod
    def of(cls, tree: Any, archive: TorchZip) -> Template | None:
        """The template of a tree just unpickled from `archive` (None: a tensor sits where `rebuild` cannot
        reach it). The archive's storages, in the order first asked for, are the requests to replay."""
        carriers: set[int] = set()
        try:
            _holds(tree, {}, carriers)
        except _NoTemplate:
            return None
        requests = [(key, s.dtype, s.nbytes // itemsize(s.dtype)) for key, s in archive.storages().items()]
        return cls(tree, requests, carriers)

    def rebuild(self, archive: TorchZip, skip: frozenset[str] = frozenset()) -> Any:
        """The tree these bytes give in `archive`: its storages asked for as the unpickling did (so a record
        missing, short or out of place is refused with the same words), its tensors pointing at them.
        `skip`: top-level keys whose values the caller does not read (`_Program.lean`); every storage is
        still asked for and checked, only the objects nobody reads are not made."""
        program = self._program(skip)
        tree, made = program.run(archive.storages_for(self.requests, program.keys), self.tree)
        _LAST.value = (tree, program, made)
        return tree

    def asked(self, skip: frozenset[str] = frozenset()) -> tuple[list[tuple[str, str, int]], frozenset[str] | None]:
        """(requests, wanted keys) that `rebuild(archive, skip)` hands `storages_for`: the same objects
        every time (`rankrepeat` knows a replay by them)."""
        return self.requests, self._program(skip).keys

    def _program(self, skip: frozenset[str]) -> _Program:
        if not skip:
            return self.program
        return self.leans.get(skip) or self.leans.setdefault(skip, self.program.lean(skip))


def _holds(obj: Any, seen: dict[int, bool], carriers: set[int]) -> bool:
    """Whether `obj` holds a tensor; each container that does is put in `carriers`. The tree passed
    `check_tree` (no cycles, bounded depth), and shared sub-trees are walked once."""
    key = id(obj)
    if key in seen:
        return seen[key]
    kind = type(obj)
    if kind is TensorRef:
        if obj.attrs:
            raise _NoTemplate
        found = True
    elif kind is dict or kind is _OrderedDict:
        if any([_holds(k, seen, carriers) for k in obj]) or (
            kind is _OrderedDict and any([_holds(v, seen, carriers) for v in vars(obj).values()])
        ):
            raise _NoTemplate  # a tensor as a key, or in an OrderedDict's attributes
        found = any([_holds(v, seen, carriers) for v in obj.values()])
    elif kind is list or kind is tuple:
        found = any([_holds(v, seen, carriers) for v in obj])
    elif isinstance(obj, _LEAVES):
        found = False
    elif isinstance(obj, set | frozenset | InertDict | Record | slice):
        if isinstance(obj, Record):
            parts = list(vars(obj).values())
        elif isinstance(obj, slice):
            parts = [obj.start, obj.stop, obj.step]
        else:
            values = obj.values() if isinstance(obj, InertDict) else ()
            parts = [*obj, *values, *getattr(obj, "__dict__", {}).values()]
        if any([_holds(v, seen, carriers) for v in parts]):
            raise _NoTemplate
        found = False
    else:
        raise _NoTemplate  # a type this walk does not know: never shared between archives
    seen[key] = found
    if found and kind is not TensorRef:
        carriers.add(key)
    return found


class _Program:
    """How `rebuild` copies a template's tree: every tensor and every container on a path to one gets a slot
    (a sub-tree shared in the template gets one, so it stays shared), the tensors are made in one pass, then
    each container from its children's slots, children first. Values off those paths are the template's own
    objects (immutable in use), as a recursive copy would leave them."""

    __slots__ = ("base", "builds", "keys", "root", "tensors")

    def __init__(self, tree: Any, carriers: set[int]) -> None:
        self.base: list[Any] = []  # a slot per distinct child: a template value, or filled per rebuild
        self.tensors: list[tuple[int, str, int, tuple[int, ...], tuple[int, ...], str]] = []
        self.builds: list[tuple[int, type, Sequence[Any], list[int], dict[str, Any] | None]] = []
        self.root = self._slot(tree, carriers, {})
        self.keys: frozenset[str] | None = None  # the storages its tensors point at; None: all asked for

    def lean(self, skip: frozenset[str]) -> _Program:
        """This program for a caller that does not read the values of the root's keys in `skip` (another
        stage-3 rank's module placeholders): each such value that is a flat mapping of tensors is its names
        mapped to None (one mapping, made here), and the tensors nothing else holds are not made. Anything
        else is built whole."""
        build_of = {b[0]: b for b in self.builds}
        root, tensor_slots = build_of.get(self.root), {t[0] for t in self.tensors}
        if root is None or root[1] not in (dict, _OrderedDict):
            return self
        flat = {
            child
            for key, child in zip(root[2], root[3], strict=True)
            if key in skip and child in build_of and build_of[child][1] in (dict, _OrderedDict)
            and all(c in tensor_slots for c in build_of[child][3])
        }
        if not flat:
            return self
        base = self.base.copy()
        for a in flat:  # made once, shared by every rebuild: nobody reads its values (or changes it)
            _, kind, keys, _, attrs = build_of[a]
            base[a] = new = kind(dict.fromkeys(keys))
            if attrs:
                vars(new).update(attrs)
        builds = [b for b in self.builds if b[0] not in flat]
        held = {c for b in builds for c in b[3]} | {self.root}
        tensors = [t for t in self.tensors if t[0] in held]
        # the slots still used, renumbered: a rebuild copies a base of those alone (1,284 slots a
        # 126-layer model's placeholders were, for 4 used)
        used = sorted(held | {b[0] for b in builds} | {t[0] for t in tensors})
        at = {old: new for new, old in enumerate(used)}
        lean = object.__new__(_Program)
        lean.base, lean.root = [base[i] for i in used], at[self.root]
        lean.builds = [(at[a], k, ks, [at[c] for c in cs], attrs) for a, k, ks, cs, attrs in builds]
        lean.tensors = [(at[t[0]], *t[1:]) for t in tensors]
        lean.keys = frozenset(t[1] for t in lean.tensors)
        return lean

    def _slot(self, obj: Any, carriers: set[int], slots: dict[int, int]) -> int:
        """The slot of `obj`, its children's (and their builds) placed first. The tree passed `check_tree`
        (bounded depth, no cycles), so the recursion is bounded."""
        key = id(obj)
        if key in slots:
            return slots[key]
        kind = type(obj)
        if kind is not TensorRef and key in carriers:
            items = list(obj.items()) if kind is dict or kind is _OrderedDict else [(None, v) for v in obj]
            children = [self._slot(v, carriers, slots) for _, v in items]
            at = slots[key] = len(self.base)
            self.base.append(None)
            keys = [k for k, _ in items] if kind is dict or kind is _OrderedDict else ()
            self.builds.append((at, kind, keys, children, dict(vars(obj)) if kind is _OrderedDict else None))
            return at
        at = slots[key] = len(self.base)
        self.base.append(obj)
        if kind is TensorRef:
            s = obj.storage
            self.tensors.append((at, s.key, obj.storage_offset, obj.shape, obj.stride, obj.dtype))
        return at

    def run(self, refs: dict[str, StorageRef], tree: Any) -> tuple[Any, list[TensorRef]]:
        """The tree with every tensor pointing at `refs` (the new archive's storages), and those tensors in
        the program's order."""
        if not self.builds and not self.tensors:
            return tree, []
        slots = self.base.copy()
        made = []
        for at, key, offset, shape, stride, dtype in self.tensors:
            slots[at] = t = TensorRef(refs[key], offset, shape, stride, dtype)
            made.append(t)
        for at, kind, keys, children, attrs in self.builds:
            values = [slots[i] for i in children]
            if kind is dict:
                slots[at] = dict(zip(keys, values, strict=True))
            elif kind is _OrderedDict:
                new = _OrderedDict(zip(keys, values, strict=True))
                vars(new).update(attrs or {})
                slots[at] = new
            else:
                slots[at] = kind(values)  # list or tuple
        return slots[self.root], made


_LAST = threading.local()  # each thread's last rebuilt tree: (tree, program, tensors made)


def rebuilt(tree: Any) -> tuple[object, list[TensorRef]] | None:
    """(the program that made it, its tensors in that program's order) where `tree` is the last tree this
    thread rebuilt: two trees one program made differ only in those tensors (`parse/reparse.py` reads the
    one it parsed first into the other's records)."""
    last = getattr(_LAST, "value", None)
    return (last[1], last[2]) if last is not None and last[0] is tree else None


_TEMPLATES: dict[bytes, Template | None] = {}
_BY_CRC: dict[tuple[int, int], bytes] = {}  # (length, CRC-32) -> the key above: found without hashing
# a pickle's bytes again (a 126-layer model's 199 KB cost 120 us a file to hash, 15 to compare)
_TEMPLATES_MAX = 8  # a save's rank files write a handful of distinct pickles (model, optimizer, rank 0's)
_TEMPLATE_MAX_BYTES = 256 << 10  # a rank file's pickle is a few KiB; larger ones are unpickled every time
_TEMPLATES_BYTES = 1 << 20  # the pickles kept in all: their trees stay alive for the process


def seen(length: int, crc: int) -> bytes | None:
    """The bytes of a pickle kept here with this length and CRC-32, if one is: bytes equal to them are
    these bytes, which matched this CRC-32 before (`TorchZip.read_entry` then computes it no more)."""
    return _BY_CRC.get((length, crc))


def template_for(data: bytes, crc: int | None = None) -> Template | None:
    """The template of these exact pickle bytes (whose CRC-32 is `crc`), if one was made."""
    if len(data) > _TEMPLATE_MAX_BYTES:
        return None
    key = _BY_CRC.get((len(data), zlib.crc32(data) if crc is None else crc))
    return _TEMPLATES.get(key) if key is not None and key == data else None


def learn(data: bytes, tree: Any, archive: TorchZip, crc: int | None = None) -> None:
    """Keep the template of `data` (seen at least twice: a pickle met once is not walked for nothing)."""
    at = (len(data), zlib.crc32(data) if crc is None else crc)
    held = _BY_CRC.get(at)
    if len(data) > _TEMPLATE_MAX_BYTES or (held is not None and held in _TEMPLATES):  # kept; or another
        return  # pickle of that length and CRC-32 is: this one is unpickled every time
    while _TEMPLATES and (
        len(_TEMPLATES) >= _TEMPLATES_MAX or sum(map(len, _TEMPLATES)) + len(data) > _TEMPLATES_BYTES
    ):
        old = next(iter(_TEMPLATES))  # the oldest forgotten first
        _TEMPLATES.pop(old, None)
        _BY_CRC.pop((len(old), zlib.crc32(old)), None)
    _TEMPLATES[data] = Template.of(tree, archive)
    _BY_CRC[at] = data


def forget() -> None:
    """Every template dropped (tests that compare a scan with them and without)."""
    _TEMPLATES.clear()
    _BY_CRC.clear()
