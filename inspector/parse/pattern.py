"""PEFT's module-name patterns (`rank_pattern` / `alpha_pattern` keys), matched in linear time.

PEFT (`peft.utils.other.get_pattern_key`) takes a key as a regex that must match a suffix of the module name
starting at its beginning or right after a `.`: `re.match(rf"(.*\\.)?({key})$", name)`. Python's backtracking
engine takes exponential time on keys such as `.*.*.*…!`, and the keys come from a downloaded file. Here the
same question is answered by a Thompson NFA run over the name once (time: name length times pattern states), for
the regular part of the syntax PEFT users write: literals, `.`, classes (`[a-z0-9_]`, `[^.]`, `\\d`, `\\w`,
`\\s`), groups with alternation (`(q|k|v)_proj`, `(?:...)`), the quantifiers `* + ? {m} {m,} {m,n}` (lazy or
not: only whether a match exists matters), `^` first and `$` last. What is not regular or not in that list
(back-references, look-arounds, inline flags, `\\b`) is refused with a message, never tried.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_STATES = 4096  # a 512-character key with bounded repeats stays far below
MAX_REPEAT = 100  # {m,n} bounds: each copy is states

Pred = Callable[[str], bool]
_SPECIAL = set("()[]{}*+?|^$\\.")
_ESCAPES: dict[str, Pred] = {
    "d": str.isdecimal,
    "D": lambda c: not c.isdecimal(),
    "w": lambda c: c.isalnum() or c == "_",
    "W": lambda c: not (c.isalnum() or c == "_"),
    "s": str.isspace,
    "S": lambda c: not c.isspace(),
}


def _equal(c: str) -> Pred:
    return lambda ch: ch == c


def _between(lo: str, hi: str) -> Pred:
    return lambda ch: lo <= ch <= hi


class PatternError(ValueError):
    """A key outside the syntax matched here; the message says which part."""


@dataclass
class _State:
    pred: Pred | None = None  # a character state: the test, then `out`; None: an epsilon state
    out: list[int] = field(default_factory=list)


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
        begin = self._closure({self.start})
        current = set(begin)
        for c in name:
            step = {o for s in current if self._takes(s, c) for o in self.states[s].out}
            current = self._closure(step)
            if c == "." and not self.anchored:  # a suffix may start right after any dot
                current |= begin
        return self.accept in current

    def _takes(self, state: int, c: str) -> bool:
        pred = self.states[state].pred
        return pred is not None and pred(c)

    def _closure(self, seeds: set[int]) -> set[int]:
        seen, todo = set(seeds), list(seeds)
        while todo:
            s = todo.pop()
            if self.states[s].pred is None:
                for o in self.states[s].out:
                    if o not in seen:
                        seen.add(o)
                        todo.append(o)
        return seen


@functools.lru_cache(maxsize=1024)
def compile_pattern(key: str) -> SuffixPattern:
    """`key` compiled for `SuffixPattern.matches`; PatternError naming the first construct not matched here."""
    if not any(c in _SPECIAL for c in key):
        return SuffixPattern((), 0, 0, False, key)
    anchored = key.startswith("^")
    body = key[1:] if anchored else key
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    parser = _Parser(body)
    start, end = parser.alternation()
    if parser.pos != len(body):
        raise PatternError(f"an unmatched {body[parser.pos]!r} at character {parser.pos}")
    accept = parser.new()
    parser.link(end, accept)
    return SuffixPattern(tuple(parser.states), start, accept, anchored, None)


class _Parser:
    """Recursive descent straight into NFA fragments: each construct returns (entry state, exit state)."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0
        self.states: list[_State] = []

    def new(self, pred: Pred | None = None) -> int:
        if len(self.states) >= MAX_STATES:
            raise PatternError("it is too large to match")
        self.states.append(_State(pred))
        return len(self.states) - 1

    def link(self, a: int, b: int) -> None:
        self.states[a].out.append(b)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def alternation(self) -> tuple[int, int]:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.sequence())
        if len(branches) == 1:
            return branches[0]
        entry, exit_ = self.new(), self.new()
        for a, b in branches:
            self.link(entry, a)
            self.link(b, exit_)
        return entry, exit_

    def sequence(self) -> tuple[int, int]:
        entry = self.new()
        last = entry
        while self.peek() not in ("", "|", ")"):
            a, b = self.repeated()
            self.link(last, a)
            last = b
        return entry, last

    def repeated(self) -> tuple[int, int]:
        begin = self.pos
        frag = self.atom()
        end = self.pos
        if self.peek() not in ("*", "+", "?", "{"):
            return frag
        low, high = self.quantifier()
        if self.peek() == "?":
            self.pos += 1  # lazy: the same set of matches
        if self.peek() in ("*", "+", "?", "{"):
            raise PatternError(f"a repeated repeat at character {self.pos}")
        return self.repeat(self.text[begin:end], frag, low, high)

    def quantifier(self) -> tuple[int, int | None]:
        c = self.text[self.pos]
        self.pos += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        close = self.text.find("}", self.pos)
        inner = self.text[self.pos : close] if close >= 0 else ""
        low_s, comma, high_s = inner.partition(",")
        if close < 0 or not low_s.isdigit() or not (high_s.isdigit() or not high_s):
            raise PatternError(f"a repeat count it does not read at character {self.pos - 1}")
        self.pos = close + 1
        low = int(low_s)
        high = None if comma and not high_s else int(high_s or low_s)
        if low > MAX_REPEAT or (high is not None and (high > MAX_REPEAT or high < low)):
            raise PatternError(f"a repeat count above {MAX_REPEAT} or out of order")
        return low, high

    def repeat(self, text: str, frag: tuple[int, int], low: int, high: int | None) -> tuple[int, int]:
        """The atom `low` times, then up to `high` more optional copies (or a loop): each copy its own states,
        parsed again from the atom's `text`."""
        copies = iter([frag])

        def copy() -> tuple[int, int]:
            return next(copies, None) or self.reparse(text)

        entry = self.new()
        last = entry
        for _ in range(low):
            a, b = copy()
            self.link(last, a)
            last = b
        if high is None:
            a, b = copy()
            loop = self.new()
            self.link(last, loop)
            self.link(loop, a)
            self.link(b, loop)
            return entry, loop
        exit_ = self.new()
        for _ in range(high - low):
            a, b = copy()
            self.link(last, a)
            self.link(last, exit_)
            last = b
        self.link(last, exit_)
        return entry, exit_

    def reparse(self, text: str) -> tuple[int, int]:
        sub = _Parser(text)
        sub.states = self.states  # one state list: the copy's states join this pattern's
        return sub.atom()

    def atom(self) -> tuple[int, int]:
        c = self.peek()
        if c == "(":
            return self.group()
        if c == "[":
            return self.single(self.char_class())
        if c == ".":
            self.pos += 1
            return self.single(lambda ch: ch != "\n")
        if c == "\\":
            return self.single(self.escape())
        if c in ("*", "+", "?", "{"):
            raise PatternError(f"a repeat with nothing to repeat at character {self.pos}")
        if c in ("^", "$"):
            raise PatternError(f"an anchor inside the pattern at character {self.pos}")
        self.pos += 1
        return self.single(_equal(c))

    def single(self, pred: Pred) -> tuple[int, int]:
        s, e = self.new(pred), self.new()
        self.link(s, e)
        return s, e

    def group(self) -> tuple[int, int]:
        self.pos += 1
        if self.text.startswith("?:", self.pos):
            self.pos += 2
        elif self.peek() == "?":
            raise PatternError("a look-around, named group or inline flag, which is not matched here")
        frag = self.alternation()
        if self.peek() != ")":
            raise PatternError("an unclosed group")
        self.pos += 1
        return frag

    def escape(self) -> Pred:
        self.pos += 1
        c = self.peek()
        self.pos += 1
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c and not c.isalnum():
            return _equal(c)
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
                tests.append(_between(c, hi))
            else:
                tests.append(_equal(c))
        return (
            (lambda ch: not any(t(ch) for t in tests)) if negate else (lambda ch: any(t(ch) for t in tests))
        )
