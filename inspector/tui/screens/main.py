"""The main screen: which checkpoint (roots, tags), then the Overview and Tensors tabs."""

from __future__ import annotations

import os

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Header, Select, Static, TabbedContent, TabPane

from inspector.errors import InspectorError
from inspector.scan.layouts import Found
from inspector.scan.model import Checkpoint
from inspector.tui.fmt import fit_path, plural, shown, shown_markup
from inspector.tui.screens.health import HealthPane
from inspector.tui.screens.overview import OverviewPane
from inspector.tui.screens.tensors import TensorsPane
from inspector.tui.typed import zi
from inspector.tui.widgets.health_view import HealthTable
from inspector.tui.widgets.keybar import KeyBar


class MainScreen(Screen[None]):
    # The overview has the keys from launch: arrows and PageDown/End scroll it (a hidden root chooser or the tag
    # dropdown, Textual's first focusable widgets, would take `↓` into an invisible menu).
    AUTO_FOCUS = "OverviewPane"
    BINDINGS = [
        Binding("o", "tab('overview')", "Overview", show=False),  # the tabs show these (and take clicks)
        Binding("t", "tab('tensors')", "Tensors", show=False),
        Binding("h", "health", "Health", show=False),
        Binding("m", "name_selection", "Name selection", show=False),  # saved for the export form (`?`)
        Binding("p", "pick_selection", "Selections", show=False),  # proposed and saved (`?`)
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="source-bar"):
            yield Select[str](
                [], id="roots", prompt="root", allow_blank=True, classes="-hidden", compact=True
            )
            yield Select[str]([], id="tags", prompt="tag", allow_blank=True, compact=True)
            yield Static("", id="status")
        with TabbedContent(initial="overview", id="tabs"):
            with TabPane("Overview", id="overview"):
                yield OverviewPane()
            with TabPane("Tensors", id="tensors"):
                yield TensorsPane()
            with TabPane("Health", id="health"):
                yield HealthPane()
        yield KeyBar()

    # the header's title is "zero-inspector — <sub_title>" between Textual's icon (8 cells) and clock space (10)
    TITLE_ROOM = len("zero-inspector — ") + 8 + 10 + 2

    def __init__(self) -> None:
        super().__init__()
        self._where: tuple[str, str | None] = ("", None)  # the root and tag the header names

    def on_mount(self) -> None:
        zi(self).begin()

    def on_resize(self, event: events.Resize) -> None:
        self._title(*self._where)

    def _title(self, root: str, tag: str | None) -> None:
        """The root and tag in the header; a long root gives way (`…/run/checkpoint`) so the tag stays whole."""
        self._where = (root, tag)
        at = f" @ {shown(tag)}" if tag else ""
        room = max(self.size.width or self.app.size.width, 40) - self.TITLE_ROOM - len(at)
        self.sub_title = fit_path(shown(root), max(room, 12)) + at

    @property
    def tensors_pane(self) -> TensorsPane:
        return self.query_one(TensorsPane)

    def action_tab(self, tab: str) -> None:
        self.show_tab(tab)

    @property
    def health_pane(self) -> HealthPane:
        return self.query_one(HealthPane)

    def show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        if tab == "tensors":
            self.tensors_pane.focus_tree()
        elif tab == "health":
            self.health_pane.table.focus()
        else:  # back from the tree: the overview's keys (scrolling), not the hidden tree's
            self.query_one(OverviewPane).focus()

    def action_health(self) -> None:
        """`h`: the Health tab, and the pass for the shown tag started (or its finished result shown)."""
        self.show_tab("health")
        self.health_pane.start()

    def action_name_selection(self) -> None:
        """`m`: save the selection under a name (actions.name_selection)."""
        from inspector.tui.actions import name_selection

        name_selection(zi(self))

    def action_pick_selection(self) -> None:
        """`p`: the named selections, proposed and saved (actions.pick_selection)."""
        from inspector.tui.actions import pick_selection

        pick_selection(zi(self))

    def on_health_table_open(self, event: HealthTable.Open) -> None:
        """Enter on a health row: the tensor in the tree, its detail beside it."""
        self.show_tab("tensors")
        self.tensors_pane.reveal(event.name)

    def select(self, how: str) -> None:
        tree = self.tensors_pane.module_tree
        tree.action_select_all() if how == "all" else tree.action_select_none()

    def status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    def focus_roots(self) -> None:
        roots = self.query_one("#roots", Select)
        if roots.has_class("-hidden"):
            self.notify("This path holds a single checkpoint.", timeout=3)
        else:
            roots.focus()
            roots.expanded = True

    # --- driven by the app --------------------------------------------------------------------------------

    def scanning(self, root: str, tag: str | None) -> None:
        """A scan started: every view of the previous checkpoint is emptied now, not when the scan ends (it
        may be refused, and nothing of the old one may stay on screen or be exported under the new name)."""
        self._title(root, tag)
        self.query_one(OverviewPane).clear()
        self.tensors_pane.clear()
        self.health_pane.clear()
        self.status(
            f"[italic]scanning {shown_markup(os.path.basename(root))}{' @ ' + shown_markup(tag) if tag else ''}…[/]"
        )
        roots = self.query_one("#roots", Select)
        many = len(zi(self).roots) > 1
        roots.set_class(not many, "-hidden")
        if many:
            with self.prevent(Select.Changed):
                base = os.path.commonpath(zi(self).roots)
                roots.set_options(
                    [(Text(shown(os.path.relpath(r, base))), r) for r in zi(self).roots]
                )
                roots.value = root

    def located(self, loc: Found, latest: str | None, *, opened: bool = True) -> None:
        """The root's tags are known; `opened` False: the asked-for one is missing, none is chosen (the list,
        `[` and `]` open one)."""
        tags = self.query_one("#tags", Select)
        known = loc.tags or ((loc.tag,) if loc.tag else ())  # a layout's own folder may name only its own
        with self.prevent(Select.Changed):
            tags.set_options(
                [(Text(shown(t) + (" ★ latest" if t == latest else "")), t) for t in reversed(known)]
            )
            if opened and loc.tag:  # a tagless folder (a universal checkpoint) has none to choose
                tags.value = loc.tag
        if opened:
            self.status("[italic]reading rank files…[/]")

    def scanned(self, ckpt: Checkpoint, seconds: float) -> None:
        self._title(ckpt.root, ckpt.tag)
        bad = f" · [bold red]{plural(len(ckpt.errors), 'error')}[/]" if ckpt.errors else ""
        took = f" · {seconds:.2f} s" if zi(self).live_meters else ""
        self.status(
            f"ZeRO-{ckpt.stage} · {plural(ckpt.world_size, 'rank')} · {plural(len(ckpt.tensors), 'tensor')}{bad}{took}"
        )
        self.query_one(OverviewPane).show(ckpt, zi(self).latest_tag)
        self.tensors_pane.show(ckpt)
        self.health_pane.show(ckpt)
        if self.focused is None:
            if self.query_one(TabbedContent).active == "tensors":
                self.tensors_pane.focus_tree()
            else:
                self.query_one(OverviewPane).focus()

    def failed(self, exc: InspectorError) -> None:
        self.status(f"[bold red]{shown_markup(exc.title)}[/]: {shown_markup(exc.message)}")
        app = zi(self)
        choose = []
        if len(app.roots) > 1:
            choose.append("r chooses another root")
        if app.tags:
            choose.append("the tag list, [ and ] open another tag")
        self.query_one(OverviewPane).failed(exc, "; ".join(choose))

    def on_select_changed(self, event: Select.Changed) -> None:
        app = zi(self)
        if event.value is Select.BLANK or not isinstance(event.value, str):
            return
        shown_tag = app.ckpt.tag if app.ckpt is not None else app.asked_tag
        if event.select.id == "tags" and app.root and event.value != shown_tag:
            app.scan(app.root, event.value)
        elif event.select.id == "roots" and event.value != app.root:
            app.scan(event.value, None)
