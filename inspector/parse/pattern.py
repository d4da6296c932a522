"""PEFT's module-name patterns (`rank_pattern` / `alpha_pattern` keys), matched in linear time.

PEFT (`peft.utils.other.get_pattern_key`) takes a key as a regex that must match a suffix of the module name
starting at its beginning or right after a `.`: `re.match(rf"(.*\\.)?({key})$", name)`. Python's backtracking
engine takes exponential time on keys such as `.*.*.*…!`, and the keys come from a downloaded file. Here the
same question is answered by a Thompson NFA run over the name once (time: name length times pattern states), for
the regular part of the syntax PEFT users write: literals, `.`, classes (`[a-z0-9_]`, `[^.]`, `\\d`, `\\w`,
`\\s`), groups with alternation (`(q|k|v)_proj`, `(?:...)`), the quantifiers `* + ? {m} {m,} {m,n}` (lazy or
not: only whether a match exists matters), `^` first and `$` last. What is not regular or not in that list
(back-references, look-arounds, inline flags, `\\b`) is refused with a message, never tried.

Nothing recurses: the key is read once into postfix order with an explicit operator stack and built into the
NFA with a fragment stack (a repeat copies its atom's states), so any nesting costs stack entries, not Python
frames. A config's keys are matched together (`PatternSet`): one run per module name answers for every key,
within one budget of states for all keys and one of steps for all names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MAX_STATES = 4096  # a 512-character key with bounded repeats stays far below
MAX_REPEAT = 100  # {m,n} bounds: each copy is states
MAX_SET_STATES = 1 << 16  # every key of one config together (a few MiB of states)
MAX_SET_STEPS = 1 << 25  # states times characters of the names matched against them (seconds at most)
_COUNT = re.compile("[0-9]{1,6}")  # ASCII digits: str.isdigit() takes `²`, which int() then refuses

Pred = Callable[[str], bool]
_SPECIAL = set("()[]{}*+?|^$\\.")
_within: Callable[[str, str], Pred] = lambda lo, hi: lambda ch: lo <= ch <= hi  # noqa: E731
_ESCAPES: dict[str, Pred] = {
    "d": str.isdecimal,
    "D": lambda c: not c.isdecimal(),
    "w": lambda c: c.isalnum() or c == "_",
    "W": lambda c: not (c.isalnum() or c == "_"),
    "s": str.isspace,
    "S": lambda c: not c.isspace(),
}


class PatternError(ValueError):
    """A key outside the syntax matched here (`key`: which, in a `PatternSet`); the message says which part."""

    key: str | None = None


@dataclass
class _State:
    pred: Pred | None = None  # a character state: the test, then `out`; None: an epsilon state
    out: list[int] = field(default_factory=list)


States = list[_State] | tuple[_State, ...]


@dataclass(frozen=True)
class SuffixPattern:
    """One compiled key. `matches(name)` answers what PEFT's `re.match(rf"(.*\\.)?({key})$", name)` does."""

    states: tuple[_State, ...]
    start: int
    accept: int
    anchored: bool  # `^` first: only the whole name can match
    literal: str | None  # a key without any regex syntax: a plain suffix test

    def matches(self, name: str) -> bool:
        if self.literal is not None:
            return name == self.literal or name.endswith("." + self.literal)
        begin = _closure(self.states, {self.start})
        return self.accept in _run(self.states, begin, set() if self.anchored else begin, name)


def compile_pattern(key: str) -> SuffixPattern:
    """`key` compiled for `SuffixPattern.matches`; PatternError naming the first construct not matched here."""
    states: list[_State] = []
    start, accept, anchored, literal = _compile_into(key, states, MAX_STATES)
    return SuffixPattern(tuple(states), start, accept, anchored, literal)


class PatternSet:
    """A config's keys matched together: `first(name)` is the index of the key PEFT's get_pattern_key picks
    for `name` (the first that matches; None if none), from one NFA run over the name for every regex key
    and a dictionary look-up per dot for the literal ones. All keys share one budget of states."""

    def __init__(self, keys: Iterable[str], max_states: int = MAX_SET_STATES) -> None:
        self.states: list[_State] = []
        self.literals: dict[str, int] = {}
        self.accepts: dict[int, int] = {}  # accept state -> key index
        free, anchored = set[int](), set[int]()
        for i, key in enumerate(keys):
            limit = min(len(self.states) + MAX_STATES, max_states)
            try:
                start, accept, is_anchored, literal = _compile_into(key, self.states, limit)
            except PatternError as exc:
                if "too large" in str(exc) and limit == max_states:
                    raise PatternError(f"the keys together need more than {max_states:,} states") from None
                exc.key = key
                raise
            if literal is not None:
                self.literals.setdefault(literal, i)
                continue
            self.accepts[accept] = i
            (anchored if is_anchored else free).add(start)
        self._free = _closure(self.states, free)
        self._begin = _closure(self.states, free | anchored)

    def check_steps(self, chars: int) -> None:
        """PatternError when matching names of `chars` characters in all could take more than MAX_SET_STEPS
        steps (one step: one state for one character)."""
        limit = MAX_SET_STEPS
        if self.accepts and len(self.states) * chars > limit:
            raise PatternError(
                f"{len(self.states):,} pattern states against {chars:,} characters of module names is more "
                f"than {limit:,} steps of matching"
            )

    def first(self, name: str) -> int | None:
        cuts = [0] + [j + 1 for j, c in enumerate(name) if c == "."]
        hits = [self.literals[name[j:]] for j in cuts if name[j:] in self.literals]
        if self.accepts:
            current = _run(self.states, self._begin, self._free, name)
            hits += [self.accepts[s] for s in current if s in self.accepts]
        return min(hits, default=None)


def _run(states: States, begin: set[int], free: set[int], name: str) -> set[int]:
    """The states active after `name`: one step per character (time: name length times states), and the
    states `free` again after each dot, where a suffix may start."""
    current = set(begin)
    for c in name:
        step: set[int] = set()
        for s in current:
            pred = states[s].pred
            if pred is not None and pred(c):
                step.update(states[s].out)
        current = _closure(states, step)
        if c == ".":
            current |= free
    return current


def _closure(states: States, seeds: set[int]) -> set[int]:
    seen, todo = set(seeds), list(seeds)
    while todo:
        s = todo.pop()
        if states[s].pred is None:
            for o in states[s].out:
                if o not in seen:
                    seen.add(o)
                    todo.append(o)
    return seen


def _compile_into(key: str, states: list[_State], limit: int) -> tuple[int, int, bool, str | None]:
    """`key`'s NFA appended to `states` (at most `limit` states in all): start, accept, anchored, literal."""
    if not any(c in _SPECIAL for c in key):
        return 0, 0, False, key
    anchored = key.startswith("^")
    body = key[1:] if anchored else key
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    builder = _Builder(states, limit)
    for token in _postfix(_tokens(body)):
        builder.apply(token)
    start, end, _ = builder.stack.pop()
    accept = builder.new()
    builder.link(end, accept)
    return start, accept, anchored, None


Token = tuple  # ("atom", pred) ("empty",) ("open",) ("close",) ("alt",) ("cat",) ("repeat", low, high)


def _tokens(text: str) -> Iterable[Token]:
    """The key's tokens, with the implicit concatenations written out and empty branches as ("empty",)."""
    reader = _Reader(text)
    prev = "start"  # what came last: start, open, alt (nothing to repeat or join yet), or operand
    while reader.pos < len(text):
        at, c = reader.pos, text[reader.pos]
        if c in "*+?{":
            if prev != "operand":
                raise PatternError(f"a repeat with nothing to repeat at character {at}")
            yield ("repeat", *reader.quantifier())
            if reader.peek() in ("*", "+", "?", "{"):
                raise PatternError(f"a repeated repeat at character {reader.pos}")
            continue
        if c == "|" or c == ")":
            if prev != "operand":
                yield ("empty",)
            reader.pos += 1
            yield ("alt",) if c == "|" else ("close",)
            prev = "alt" if c == "|" else "operand"
            continue
        if prev == "operand":
            yield ("cat",)
        if c == "(":
            reader.open_group()
            yield ("open",)
            prev = "open"
            continue
        yield ("atom", reader.atom())
        prev = "operand"
    if prev != "operand":
        yield ("empty",)


def _postfix(tokens: Iterable[Token]) -> Iterable[Token]:
    """Shunting-yard: operands and repeats (postfix already) pass through; `cat` binds tighter than `alt`."""
    ops: list[str] = []
    for token in tokens:
        kind = token[0]
        if kind in ("atom", "empty", "repeat"):
            yield token
        elif kind == "open":
            ops.append("open")
        elif kind == "close":
            while ops and ops[-1] != "open":
                yield (ops.pop(),)
            if not ops:
                raise PatternError("an unmatched ')'")
            ops.pop()
        else:  # cat or alt: left-associative; alt pops cat and alt, cat pops only cat
            while ops and ops[-1] != "open" and (kind == "alt" or ops[-1] == "cat"):
                yield (ops.pop(),)
            ops.append(kind)
    while ops:
        if ops[-1] == "open":
            raise PatternError("an unclosed group")
        yield (ops.pop(),)


class _Builder:
    """Thompson's construction over postfix tokens. Each fragment's states are one contiguous range (made in
    order), so a repeat copies its atom by copying that range before anything links into it."""

    def __init__(self, states: list[_State], limit: int) -> None:
        self.states, self.limit = states, limit
        self.stack: list[tuple[int, int, int]] = []  # (entry, exit, first state of the fragment)

    def new(self, pred: Pred | None = None) -> int:
        if len(self.states) >= self.limit:
            raise PatternError("it is too large to match")
        self.states.append(_State(pred))
        return len(self.states) - 1

    def link(self, a: int, b: int) -> None:
        self.states[a].out.append(b)

    def apply(self, token: Token) -> None:
        kind = token[0]
        if kind == "atom":
            s = self.new(token[1])
            self.link(s, self.new())
            self.stack.append((s, s + 1, s))
        elif kind == "empty":
            e = self.new()
            self.stack.append((e, e, e))
        elif kind == "cat":
            (b_in, b_out, _), (a_in, a_out, lo) = self.stack.pop(), self.stack.pop()
            self.link(a_out, b_in)
            self.stack.append((a_in, b_out, lo))
        elif kind == "alt":
            (b_in, b_out, _), (a_in, a_out, lo) = self.stack.pop(), self.stack.pop()
            entry, exit_ = self.new(), self.new()
            for a, b in ((entry, a_in), (entry, b_in), (a_out, exit_), (b_out, exit_)):
                self.link(a, b)
            self.stack.append((entry, exit_, lo))
        else:
            self.repeat(token[1], token[2])

    def repeat(self, low: int, high: int | None) -> None:
        """The atom `low` times, then up to `high` more optional copies (or a loop)."""
        entry0, exit0, lo = self.stack.pop()
        hi = len(self.states)
        count = low + (1 if high is None else high - low)
        copies = [(entry0, exit0)] + [self.copy(lo, hi, entry0, exit0) for _ in range(count - 1)]
        pending = iter(copies)
        entry = self.new()
        last = entry
        for _ in range(low):
            a, b = next(pending)
            self.link(last, a)
            last = b
        if high is None:
            a, b = next(pending)
            loop = self.new()
            self.link(last, loop)
            self.link(loop, a)
            self.link(b, loop)
            self.stack.append((entry, loop, lo))
            return
        exit_ = self.new()
        for _ in range(high - low):
            a, b = next(pending)
            self.link(last, a)
            self.link(last, exit_)
            last = b
        self.link(last, exit_)
        self.stack.append((entry, exit_, lo))

    def copy(self, lo: int, hi: int, entry: int, exit_: int) -> tuple[int, int]:
        """States lo..hi again (links inside the range moved with them): a fresh copy of the fragment."""
        shift = len(self.states) - lo
        if len(self.states) + hi - lo > self.limit:
            raise PatternError("it is too large to match")
        self.states.extend(_State(s.pred, [o + shift for o in s.out]) for s in self.states[lo:hi])
        return entry + shift, exit_ + shift


class _Reader:
    """The key's characters read left to right: one atom, quantifier or group opening at a time."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def open_group(self) -> None:
        self.pos += 1
        if self.text.startswith("?:", self.pos):
            self.pos += 2
        elif self.peek() == "?":
            raise PatternError("a look-around, named group or inline flag, which is not matched here")

    def quantifier(self) -> tuple[int, int | None]:
        c = self.text[self.pos]
        self.pos += 1
        if c != "{":
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        else:
            close = self.text.find("}", self.pos)
            inner = self.text[self.pos : close] if close >= 0 else ""
            low_s, comma, high_s = inner.partition(",")
            if close < 0 or not _COUNT.fullmatch(low_s) or not (_COUNT.fullmatch(high_s) or not high_s):
                raise PatternError(f"a repeat count it does not read at character {self.pos - 1}")
            self.pos = close + 1
            low = int(low_s)
            high = None if comma and not high_s else int(high_s or low_s)
            if low > MAX_REPEAT or (high is not None and (high > MAX_REPEAT or high < low)):
                raise PatternError(f"a repeat count above {MAX_REPEAT} or out of order")
        if self.peek() == "?":
            self.pos += 1  # lazy: the same set of matches
        return low, high

    def atom(self) -> Pred:
        c = self.peek()
        if c == "[":
            return self.char_class()
        if c == "\\":
            return self.escape()
        if c in ("^", "$"):
            raise PatternError(f"an anchor inside the pattern at character {self.pos}")
        self.pos += 1
        return (lambda ch: ch != "\n") if c == "." else _within(c, c)

    def escape(self) -> Pred:
        self.pos += 1
        c = self.peek()
        self.pos += 1
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c and not c.isalnum():
            return _within(c, c)
        raise PatternError(
            f"the escape \\{c} (a back-reference, boundary or unknown class), not matched here"
        )

    def char_class(self) -> Pred:
        self.pos += 1
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        tests: list[Pred] = []
        first = True
        while True:
            c = self.peek()
            if not c:
                raise PatternError("an unclosed character class")
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            if c == "\\":
                tests.append(self.escape())
                continue
            self.pos += 1
            if self.peek() == "-" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] != "]":
                hi = self.text[self.pos + 1]
                if hi == "\\" or hi < c:
                    raise PatternError("a character range it does not read")
                self.pos += 2
                tests.append(_within(c, hi))
            else:
                tests.append(_within(c, c))
        return (
            (lambda ch: not any(t(ch) for t in tests)) if negate else (lambda ch: any(t(ch) for t in tests))
        )
