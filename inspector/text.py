"""The one rule for text that leaves the tool: `shown` = escape ∘ redact.

Every string that came from a file, a listing, a URL or the environment may hold terminal control (ESC, OSC,
CSI, BEL, C1 controls, bidi overrides) or a secret (a password in a URL, a presigned URL's signature, a store's
key). The exits apply this rule themselves, so no caller can forget it:

- the CLI's consoles (`cli/console.py`: every string and every rendered segment),
- the JSON documents and JSON lines (`shown_doc`, used by `convert/events.to_line` and `cli/console.print_json`),
- the one user error (`errors.InspectorError`: message and hint), and
- the app's text helpers (`tui/fmt.shown`) and notifications.

Nothing here imports rich or textual; Rich markup is escaped on top of this by the two faces.
"""

from __future__ import annotations

import os
import re
from typing import Any

# control (Cc), format (Cf: bidi overrides and isolates, zero-width characters), line/paragraph separators
# (Zl, Zp) and lone surrogates (Cs, which would also make a print fail): every such character of Unicode
# 15.1, as one precompiled character class (no per-character category lookup on non-ASCII text). A test
# checks it covers every character of those categories in the running Python's Unicode tables.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_C0_BUT_NEWLINE = "\x00-\x09\x0b-\x1f"
_OTHERS = (
    "\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE = re.compile(f"[\n{_C0_BUT_NEWLINE}{_OTHERS}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[{_C0_BUT_NEWLINE}{_OTHERS}]")


def _code(c: str) -> str:
    return ascii(c)[1:-1]  # ESC -> \x1b, U+202E -> \u202e, a lone surrogate -> \ud800


def unsafe_char(c: str) -> bool:
    """Whether a terminal would obey `c` or it would hide or reorder what is shown (bidi, zero-width)."""
    return _UNSAFE.match(c) is not None


def has_unsafe(text: str) -> bool:
    """Whether `text` holds a character `escape` would rewrite (a newline counts)."""
    return _UNSAFE.search(text) is not None


def escape(text: str, *, newlines: bool = False) -> str:
    """`text` with every control, bidi and invisible formatting character written as its escape (`\\x1b`,
    `\\u202e`); printable characters, non-ASCII letters included, stay. `newlines` keeps `\\n` (a message of
    several lines, composed by us); a name never keeps one."""
    pattern = _UNSAFE_BUT_NEWLINE if newlines else _UNSAFE
    return pattern.sub(lambda m: _code(m.group()), text) if pattern.search(text) else text


# --------------------------------------------------------------------------------------------------------------
# secrets
# --------------------------------------------------------------------------------------------------------------

HIDDEN = "***"
# the store clients' credential variables (and the Hub's); any other variable whose name says it holds a
# secret is treated alike (`_SECRET_NAME`)
SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_CONNECTION_STRING",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|_KEY$|ACCOUNT_KEY|CONNECTION_STRING|SAS_|CREDENTIAL")
_MIN_SECRET = 6  # shorter values ("1", "true") are settings, and hiding them would garble every message
# scheme://user:password@: up to the authority's last `@` (a password may hold an unencoded one), never
# past a `/` or whitespace
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@\s:]*)(?P<password>:[^/\s]*)?@")
# a URL of any scheme: its authority, then the rest (path, query, fragment) up to whitespace or a quote
_URL = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^/?#;\s'\"]*)(?P<rest>[^\s'\"]*)")
# the URL's key=value parameters, wherever they are: the query (`?`, `&`), the fragment (`#`) and path
# parameters (`;`). Presigned URLs carry their signature in the query, SAS tokens too, and a fragment or a
# path parameter carries `api_key=` as well; a value runs to the next separator (a path parameter's to `/`)
_URL_PAIR = re.compile(r"(?P<key>[?#&;][^?#&;=]*=)(?P<value>[^?#&;]*)")
_PATH_PAIR = re.compile(r"(?P<key>;[^?#&;=/]*=)(?P<value>[^?#&;/]*)")
# key=value pairs that are credentials wherever they appear (a connection string, a query echoed in an error)
_SECRET_KEYS = (
    r"(?P<key>\b(?:AccountKey|SharedAccessSignature|SharedAccessKey|sig|signature|X-Amz-Signature|"
    r"X-Amz-Security-Token|X-Amz-Credential|X-Goog-Signature|X-Goog-Credential|access_token|client_secret|"
    r"password|token|api[_-]?key|access[_-]?key|secret(?:[_-]?(?:access[_-]?)?key)?|private[_-]?key)=)"
)
_SECRET_PAIR = re.compile(_SECRET_KEYS + r"(?P<value>[^&;\s'\"]+)", re.IGNORECASE)
_SECRET_SEGMENT = re.compile(_SECRET_KEYS + r"(?P<value>[^&;/?#\s'\"]+)", re.IGNORECASE)  # in a URL's path
_BEARER = re.compile(r"(?P<key>\bBearer\s+)(?P<value>[A-Za-z0-9._~+/=\-]+)", re.IGNORECASE)


def secret_values(environ: dict[str, str] | os._Environ[str] | None = None) -> list[str]:
    """The values this process must never show: each credential variable's, and the key parts of a
    connection string. Longest first, so a value is never half hidden by a shorter one inside it."""
    env = os.environ if environ is None else environ
    values = set()
    for name, value in env.items():
        if not _is_secret_name(name):
            continue
        if len(value) >= _MIN_SECRET:
            values.add(value)
        for m in _SECRET_PAIR.finditer(value):  # a connection string's AccountKey=...
            if len(m.group("value")) >= _MIN_SECRET:
                values.add(m.group("value"))
    return sorted(values, key=len, reverse=True)


_cache: dict[str, Any] = {"names": (), "key": None, "values": []}


def _is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_VARIABLES or (_SECRET_NAME.search(upper) is not None and not upper.endswith("_ID"))


def _current_secrets() -> list[str]:
    """`secret_values()` of this process, worked out again only when the number of variables or a credential
    variable's value changed: every string shown asks, and a table of 10⁵ names must not rescan the
    environment 10⁵ times."""
    names = _cache["names"]
    key = (len(os.environ), tuple(os.environ.get(n) for n in names))
    if key != _cache["key"]:
        names = tuple(n for n in os.environ if _is_secret_name(n))
        _cache.update(names=names, key=(len(os.environ), tuple(os.environ.get(n) for n in names)))
        _cache["values"] = secret_values()
    values: list[str] = _cache["values"]
    return values


def _hider(keep_length: bool) -> Any:
    return (lambda secret: "*" * len(secret)) if keep_length else (lambda secret: HIDDEN)


def redact(text: str, environ: dict[str, str] | None = None, *, keep_length: bool = False) -> str:
    """`text` with every secret replaced by `***`: a URL's password (and an http URL's userinfo), the value of
    every `key=value` parameter of a URL of any scheme (query, fragment and path parameters: a presigned
    URL's signature, an `#api_key=`), credential `key=value` pairs, bearer tokens, and any
    value of the store's credential variables wherever it appears. `keep_length`: one `*` per character
    instead, for a field whose positions must not move (`masked`)."""
    hide = _hider(keep_length)
    for value in _current_secrets() if environ is None else secret_values(environ):
        if value in text:
            text = text.replace(value, hide(value))

    def userinfo(m: re.Match[str]) -> str:
        scheme, user, password = m.group("scheme"), m.group("user"), m.group("password")
        if password:
            return f"{scheme}{user}:{hide(password[1:])}@"
        return f"{scheme}{hide(user)}@" if scheme.lower().startswith("http") else m.group()

    def pair(m: re.Match[str]) -> str:
        return m.group("key") + hide(m.group("value"))

    def url(m: re.Match[str]) -> str:
        rest = m.group("rest")
        cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
        path = _SECRET_SEGMENT.sub(pair, _PATH_PAIR.sub(pair, rest[:cut]))
        return m.group("head") + path + _URL_PAIR.sub(pair, rest[cut:])

    def elsewhere(part: str) -> str:  # the text between URLs: credential pairs (a connection string)
        return _SECRET_PAIR.sub(pair, part) if "=" in part else part

    if "@" in text:
        text = _USERINFO.sub(userinfo, text)
    if "=" in text:  # one pass: each URL by the URL rule, the text between by the pair rule
        last, parts = 0, []
        for m in _URL.finditer(text) if "://" in text else ():
            parts += [elsewhere(text[last : m.start()]), url(m)]
            last = m.end()
        text = "".join([*parts, elsewhere(text[last:])])
    if "earer" in text:
        text = _BEARER.sub(lambda m: m.group("key") + hide(m.group("value")), text)
    return text


# --------------------------------------------------------------------------------------------------------------
# the exits
# --------------------------------------------------------------------------------------------------------------


def shown(text: object, *, newlines: bool = False) -> str:
    """The one rule for text that reaches a person: secrets redacted, then controls escaped."""
    return escape(redact(str(text)), newlines=newlines)


def quoted(text: object, limit: int | None = 80) -> str:
    """A name inside a message, in single quotes and `shown` once, as the parser's usage errors show what was
    typed: ESC reads `\\x1b` and a backslash stays one. Never `repr` of `shown` (`f"{shown(x)!r}"`), which
    escapes the escapes again (ESC would read with two backslashes). Cut to `limit` characters of shown text,
    with an ellipsis, so a long name cannot fill the terminal (None: a path we composed, whole)."""
    text = shown(text)
    return f"'{text[:limit]}…'" if limit is not None and len(text) > limit else f"'{text}'"


def masked(text: str) -> str:
    """The rule for an editable field (the app's output folder, prefilled from the checkpoint's name): the
    same length as `text`, so cursor and selection stay where the value has them, each unsafe character as
    `\ufffd` and each secret character as `*`. The value itself is left as it is; only its picture changes."""
    text = redact(text, keep_length=True)
    return "".join("\ufffd" if unsafe_char(c) else c for c in text) if has_unsafe(text) else text


def shown_doc(doc: Any) -> Any:
    """A JSON document with `shown` applied to every string in it (keys too): the rule for `--json` output and
    `--progress json` lines, whose strings a front end shows as they are."""
    keys: dict[str, str] = {}  # a report repeats its keys (and many values) thousands of times: each
    values: dict[str, str] = {}  # distinct string is shown once a document

    def key(k: str) -> str:
        if (done := keys.get(k)) is None:
            done = keys[k] = shown(k)
        return done

    def walk(doc: Any) -> Any:
        if isinstance(doc, str):
            if (done := values.get(doc)) is None:  # a message's newline is JSON-encoded, never raw
                done = values[doc] = shown(doc, newlines=True)
            return done
        if isinstance(doc, dict):
            return {key(k) if isinstance(k, str) else k: walk(v) for k, v in doc.items()}
        if isinstance(doc, (list, tuple)):
            return [walk(v) for v in doc]
        return doc

    return walk(doc)


# --------------------------------------------------------------------------------------------------------------
# text meant for a shell
# --------------------------------------------------------------------------------------------------------------

_SHELL_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # shlex's set: no quoting needed
_SURROGATE_ESCAPED = re.compile("[\udc80-\udcff]")  # an undecodable byte, as os.fsdecode keeps it
# `!` too: an interactive bash may expand history inside `$'…'`
_SHELL_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "!": "\\x21"}


class ShellTextError(ValueError):
    """An argument no shell line can carry as it is (a lone surrogate that stands for no byte)."""


def _shell_char(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if c in _SHELL_NAMED:
        return _SHELL_NAMED[c]
    if not unsafe_char(c):
        return c
    if _SURROGATE_ESCAPED.match(c):
        return f"\\x{ord(c) - 0xDC00:02x}"  # the file name's own byte
    try:  # a control, bidi or separator character: its UTF-8 bytes, the same in every locale
        data = c.encode("utf-8")
    except UnicodeEncodeError:
        raise ShellTextError("it holds a lone surrogate that stands for no byte") from None
    return "".join(f"\\x{b:02x}" for b in data)


def shell_quote(arg: str) -> str:
    """`arg` as one word of a bash command that pastes safely: bare when it needs no quoting, in single
    quotes when it holds no control character, else as `$'…'` with every control, bidi and separator
    character and every undecodable byte written as `\\xHH` (the pasted line never holds a raw ESC or
    newline, and the shell hands the program the original bytes). ShellTextError for a lone surrogate."""
    if _SHELL_PLAIN.fullmatch(arg):
        return arg
    if not has_unsafe(arg):
        return "'" + arg.replace("'", "'\"'\"'") + "'"
    return "$'" + "".join(_shell_char(c) for c in arg) + "'"


def shell_command(argv: list[str] | tuple[str, ...]) -> str:
    """The one builder of a command line meant to be pasted into a shell (the app's `y`, hints that name a
    command): each argument `shell_quote`d."""
    return " ".join(shell_quote(a) for a in argv)


def command_hint(*argv: str) -> str:
    """A `zero-inspector …` command named in a message or hint, quoted as `shell_command` quotes it (where no
    shell line can carry an argument, its words as they are: every exit escapes them)."""
    try:
        return shell_command(("zero-inspector", *argv))
    except ShellTextError:
        return " ".join(("zero-inspector", *argv))
