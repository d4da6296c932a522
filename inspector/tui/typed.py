"""Typed access to the app from its screens and panes: Textual's `node.app` is an untyped `App`, so reading the
app's state through it needed a `type: ignore` on every line; `zi(node)` says once which app it is."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from textual.dom import DOMNode

    from inspector.tui.shell import Shell


def zi(node: DOMNode) -> Shell:
    """The zero-inspector app `node` belongs to."""
    return cast("Shell", node.app)
