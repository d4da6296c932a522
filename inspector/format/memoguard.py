"""The guard run before unpickling: a lean walk over the pickle's opcodes that refuses what no pickler of a
real checkpoint writes and what would cost memory out of proportion to the file: memo indices past the
pickle's size (the C unpickler sizes its memo table by the largest one) and opcode streams whose objects
would need far more memory than their bytes (a 9.6 MB pickle of EMPTY_SET opcodes builds 2.3 GB of sets)."""

from __future__ import annotations

import pickle
from typing import Any

# opcode -> how its argument is laid out: ("n", k) fixed k bytes; ("len", k) k-byte length then data;
# ("line", m) m newline-terminated lines. Opcodes not listed take no argument.
_ARGS: dict[int, tuple[str, int]] = {}
for ch, k in {
    "K": 1,
    "M": 2,
    "J": 4,
    "h": 1,
    "j": 4,
    "q": 1,
    "r": 4,
    "G": 8,
    "\x80": 1,
    "\x82": 1,
    "\x83": 2,
    "\x84": 4,
    "\x95": 8,
}.items():
    _ARGS[ord(ch)] = ("n", k)
for ch, k in {
    "\x8a": 1,
    "\x8b": 4,
    "U": 1,
    "T": 4,
    "X": 4,
    "\x8c": 1,
    "B": 4,
    "C": 1,
    "\x8d": 8,
    "\x8e": 8,
    "\x96": 8,
}.items():
    _ARGS[ord(ch)] = ("len", k)
for ch, m in {"c": 2, "i": 2, "I": 1, "L": 1, "S": 1, "V": 1, "F": 1, "p": 1, "g": 1, "P": 1}.items():
    _ARGS[ord(ch)] = ("line", m)
_STOP = ord(".")
# bytes an opcode can make the unpickler allocate, beyond its payload
_SET_COST = 216  # an empty set or frozenset, the largest empty container CPython builds
_DEFAULT_COST = 64  # any other opcode: at most an object or a slot
BUDGET_BASE = 256 << 20
BUDGET_PER_BYTE = 32  # a real checkpoint's pickle allocates a few times its size; allow 32x


def check_memo(data: bytes) -> None:
    """Refuse memo indices no pickler would write, and a pickle whose objects would need more memory than
    `BUDGET_BASE + BUDGET_PER_BYTE * len(data)`. The C unpickler sizes its memo table by the largest index
    (`LONG_BINPUT 0x40000000` makes it allocate and zero 16 GiB), so a few bytes could exhaust memory.
    A lean walk that skips arguments by length: 2.4x faster than pickletools.genops on real checkpoints."""
    limit = len(data)
    ops = sets = payload = 0
    pos = 0
    n = len(data)
    args = _ARGS
    while pos < n:
        op = data[pos]
        pos += 1
        ops += 1
        if op == _STOP:
            break
        spec = args.get(op)
        if spec is None:
            if op == 0x8F or op == 0x91:  # EMPTY_SET, FROZENSET: the largest empty containers
                sets += 1
            continue
        kind, k = spec
        if kind == "n":
            if op == 0x72 and int.from_bytes(data[pos : pos + 4], "little") > limit:  # LONG_BINPUT
                raise pickle.UnpicklingError(f"memo index out of range in a {limit}-byte pickle")
            pos += k
        elif kind == "len":
            size = int.from_bytes(data[pos : pos + k], "little")
            if pos + k + size > n:  # the unpickler would allocate `size` before finding the bytes missing
                raise pickle.UnpicklingError(f"an argument of {size:,} bytes runs past the end of the pickle")
            payload += size
            pos += k + size
        else:
            start = pos
            for _ in range(k):
                pos = data.find(b"\n", pos) + 1
                if pos == 0:
                    break
            if pos == 0:
                break
            if op == 0x70:  # PUT
                text = data[start : pos - 1]
                if not text.isdigit() or int(text) > limit:
                    raise pickle.UnpicklingError(f"memo index out of range in a {limit}-byte pickle")
    budget = BUDGET_BASE + BUDGET_PER_BYTE * limit
    if ops * _DEFAULT_COST + sets * (_SET_COST - _DEFAULT_COST) + payload > budget:
        raise pickle.UnpicklingError(f"its objects would need over {budget >> 20:,} MiB for a {limit:,}-byte pickle")


def pickle_end(data: bytes) -> int | None:
    """Where the pickle at the start of `data` ends (the index after its STOP), or None if `data` ends first.

    The legacy `torch.save` container is pickles back to back with no lengths: this finds each one's end
    without unpickling it, so a reader can take exactly its bytes from a window and ask for a larger window
    when one is cut. Kept apart from `check_memo`, whose loop stays lean for large pickles."""
    pos, n, args = 0, len(data), _ARGS
    while pos < n:
        op = data[pos]
        pos += 1
        if op == _STOP:
            return pos
        spec = args.get(op)
        if spec is None:
            continue
        kind, k = spec
        if kind == "n":
            pos += k
        elif kind == "len":
            if pos + k > n:
                return None
            pos += k + int.from_bytes(data[pos : pos + k], "little")
        else:
            for _ in range(k):
                found = data.find(b"\n", pos)
                if found < 0:
                    return None
                pos = found + 1
    return None


# Pickles that passed both guards (`check_memo`, then `check_tree` on what they built), by their exact bytes.
# Rank files of one save carry the same pickle (a 4,096-rank run: 8,192 files, a handful of distinct
# pickles), and both guards are functions of the bytes alone: the tree's shape comes from the opcodes, and
# the only per-file values the unpickler adds (storage records) are leaves neither guard walks into. So a
# repeat passes without walking its opcodes and tree again; bounded in entries and bytes.
_PASSED: dict[bytes, None] = {}
_PASSED_ENTRIES = 32
_PASSED_MAX_BYTES = 1 << 20  # larger pickles are walked every time (and are rare: one per save)


def passed(data: bytes) -> bool:
    """Whether these exact bytes already passed both guards in this process."""
    return len(data) <= _PASSED_MAX_BYTES and data in _PASSED


def remember(data: bytes) -> None:
    """Record that `data` passed both guards (oldest forgotten first)."""
    if len(data) > _PASSED_MAX_BYTES:
        return
    if len(_PASSED) >= _PASSED_ENTRIES:
        _PASSED.pop(next(iter(_PASSED)), None)
    _PASSED[data] = None


MAX_DEPTH = 100  # DeepSpeed's trees are under 10 deep; JSON configs a few more
TREE_BASE = 200_000
TREE_PER_BYTE = 4


class TreeError(ValueError):
    """The unpickled tree is deeper, or (through shared sub-trees) larger, than its bytes allow."""


def check_tree(tree: Any, nbytes: int) -> None:
    """Refuse a tree that later walkers could not afford. A pickle can share one sub-tree from many places
    (memo references), so 100 KB can describe 2^40 paths; and it can nest thousands deep. Every walker after
    this (digests, typed records, JSON) visits paths, so the paths are counted here, once, iteratively, and
    refused past `TREE_BASE + TREE_PER_BYTE * nbytes` visits or `MAX_DEPTH` levels."""
    budget = TREE_BASE + TREE_PER_BYTE * nbytes
    stack: list[tuple[Any, int]] = [(tree, 0)]
    visits = 0
    while stack:
        node, depth = stack.pop()
        visits += 1
        if visits > budget:
            raise TreeError(f"its shared sub-trees expand past {budget:,} nodes")
        if depth > MAX_DEPTH:
            raise TreeError(f"it nests more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for kv in node.items() for v in kv)
            attrs = getattr(node, "__dict__", None)
            if attrs:
                stack.extend((v, depth + 1) for v in attrs.values())
        elif isinstance(node, list | tuple | set | frozenset):
            stack.extend((v, depth + 1) for v in node)
        else:  # inert records, tensor references (their attrs), anything with instance state
            attrs = getattr(node, "__dict__", None) or getattr(node, "attrs", None)
            if isinstance(attrs, dict):
                stack.extend((v, depth + 1) for v in attrs.values())
