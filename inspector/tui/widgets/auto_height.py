"""A `Static` whose height is measured again after every update (a workaround for a Textual layout race).

The race (Textual 8.2.8, `widget.py`): `Widget._get_box_model` caches a widget's size under a key that
includes `self._layout_updates`, and `Widget.refresh(layout=True)` bumps that counter only when
`self._layout_required` is False. `_layout_required` is cleared by the widget's *own* idle handler
(`Widget._check_refresh`), so it stays set from one layout request until the widget's message queue next
runs empty. If the screen lays the widget out in that window (another widget's layout request makes it
measure everything) and the widget's content then changes, `update()` asks for a layout without bumping the
counter, and every later layout reuses the box model measured for the old content: an auto-height widget
keeps its old height (drawn clipped, a table a row or two short) until its width or styles change.

On the overview this happened when the scan finished before the freshly mounted widgets had seen their
first idle, which a loaded machine makes likely: the ranks table and the tag list kept the one-row height
of their empty first content. `clear_cached_dimensions()` does not help (it clears the content-size caches,
not the box model cache). tests/tui/test_layout_race.py reproduces it with a plain `Static`.

The workaround bumps the counter on every update that asks for a layout, which is what `refresh` would do
if the counter counted requests rather than transitions of `_layout_required`.
"""

from __future__ import annotations

from textual.visual import VisualType
from textual.widgets import Static


class AutoHeightStatic(Static):
    """A `Static` with `height: auto` that is re-measured after every `update`, however busy the app is."""

    DEFAULT_CSS = "AutoHeightStatic { height: auto; }"

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        super().update(content, layout=layout)
        if layout:
            # a new key for Widget._get_box_model's cache, even if a layout request is already pending
            self._layout_updates += 1
