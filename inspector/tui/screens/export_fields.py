"""The export form's values as plain data: the kinds a checkpoint is offered, sizes and lists as typed and
shown, renames read as the CLI reads them, and whether and how the TP-split rules are shown. No widgets, so
each rule is tested without a screen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from inspector.convert.kinds import DEFAULT, offers
from inspector.scan.tp_rules import Rules
from inspector.tui.fmt import shown


def format_options(ckpt: Any) -> tuple[list[tuple[str, str]], str, list[str]]:
    """The output kinds this checkpoint allows (the registry's offers), the default, and why others are not
    (a kind that is simply absent, an adapter on a checkpoint without LoRA, says nothing: `Offer.quiet`)."""
    found = offers(ckpt)
    options = [(o.label, o.name) for o in found if o.available]
    missing = [f"{o.label}: {o.reason}" for o in found if not o.available and not o.quiet]
    default = DEFAULT if any(v == DEFAULT for _, v in options) else options[0][1]
    return options, default, missing


def form_remedy(hint: str | None) -> str:
    """The CLI's remedy, pointed at the form's field where the CLI names a flag the form has a field for:
    "Pass a local copy with --base DIR" → "… in the Base model field (--base DIR)"."""
    if not hint:
        return ""
    return re.sub(r"with --base(?: DIR)?", "in the Base model field (--base DIR)", hint)


def human_size(n: int) -> str:
    units = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("GiB", 2**30), ("MiB", 2**20), ("KB", 10**3))
    for unit, mult in (*units, ("KiB", 2**10)):  # --shard-size 10KB is shown as 10KB, not 10000
        if n % mult == 0 and n >= mult:
            return f"{n // mult}{unit}"
    return str(n)


def split_list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.replace(";", ",").split(",") if p.strip())


def parse_renames(text: str) -> tuple[tuple[str, str], ...]:
    """`a=b; c=d` -> ((a, b), (c, d)); a part without `=` is an error."""
    out = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"rename {part!r} needs the form REGEX=REPLACEMENT")
        pat, _, repl = part.partition("=")
        try:
            re.compile(pat)
        except re.error as exc:
            raise ValueError(f"bad rename regex {pat!r}: {exc}") from None
        out.append((pat, repl))
    return tuple(out)


def shows_tp_split(ckpt: Any, rules: Rules) -> bool:
    """The form has a TP-split row for a tensor-parallel checkpoint, or when rules were given (`--tp-split`)."""
    return bool(rules) or (ckpt is not None and ckpt.parallel is not None and ckpt.parallel.tp > 1)


def tp_split_note(ckpt: Any, rules: Rules) -> str:
    """What the rules do for this checkpoint, in a line under them."""
    if ckpt is None:
        return "Scanning the tag with these rules…"
    unrecorded = [f for f in ckpt.errors if f.code == "tp-unrecorded"]
    if unrecorded:
        return shown(unrecorded[0].message) + " Every parameter must match a rule (a glob; first match wins)."
    if rules:
        return "In force: the shards join by these rules where the checkpoint records no split of its own."
    return "The checkpoint records how its shards join: no rules needed."


def named_fields(app: Any) -> Iterator[Any]:
    """The Selection row, when the layout proposes selections or some were saved for this root (`m`): the one
    chosen on the Tensors tab (the default), a proposed one or a saved one, with its tensor count."""
    from textual.widgets import Label, Select

    listed = app.named.listed(app.ckpt) if app.ckpt is not None else ()
    if not listed:
        return
    options = [("as chosen on the Tensors tab", "")]
    options += [(f"{shown(s.name)} ({len(s.tensors)} tensors)", s.name) for s in listed]
    now = app.selected if app.shown_only is None else set()  # the one picked with `p` is named as such
    chosen = next((s.name for s in listed if s.tensors == now), "")
    yield Label("Selection")
    yield Select(options, value=chosen, allow_blank=False, id="named", compact=True)


def apply_named(screen: Any) -> None:
    """A named selection picked in the form: it becomes the selection (`actions.use_selection`)."""
    from textual.widgets import Select

    from inspector.tui.picking import use_selection

    found = screen.query("#named")
    name = str(found.first(Select).value) if found else ""
    if name and screen.app.ckpt is not None:
        use_selection(screen.app, name)
