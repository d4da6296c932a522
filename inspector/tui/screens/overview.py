"""Overview tab: findings first when something is wrong, the summary card, the ranks view and the tags."""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from inspector.errors import InspectorError
from inspector.scan.model import Checkpoint
from inspector.tui.fmt import plural, shown
from inspector.tui.typed import zi
from inspector.tui.widgets.auto_height import AutoHeightStatic
from inspector.tui.widgets.ranks import RanksView
from inspector.tui.widgets.summary import FindingsView, SummaryCard


class OverviewPane(VerticalScroll):
    _ckpt: Checkpoint | None = None

    def compose(self) -> ComposeResult:
        yield AutoHeightStatic("", id="banner", classes="-hidden")
        yield Static("Checkpoint", classes="section")
        yield SummaryCard("[italic]Scanning…[/]")
        yield Static("Findings", classes="section")
        yield FindingsView("")
        yield Static("Ranks", classes="section")
        yield RanksView("")
        yield Static("Tags", classes="section")
        yield AutoHeightStatic("", id="tag-list")

    def on_mount(self) -> None:
        if zi(self).live_meters:  # "saved 3 minutes ago" would go stale while the app stays open
            self.set_interval(60, self._saved_again)

    def _saved_again(self) -> None:
        if self._ckpt is not None:
            self.query_one(SummaryCard).show(self._ckpt, zi(self).saved_ago(self._ckpt))

    def show(self, ckpt: Checkpoint, latest: str | None) -> None:
        banner = self.query_one("#banner", Static)
        if ckpt.errors:
            banner.update(
                Text.assemble(
                    ("✖ This checkpoint is damaged: ", "bold"),
                    f"{plural(len(ckpt.errors), 'error')}. Converting it would write wrong weights; see Findings below.",
                )
            )
        banner.set_class(not ckpt.errors, "-hidden")
        self._ckpt = ckpt
        self.query_one(SummaryCard).show(ckpt, zi(self).saved_ago(ckpt))
        self.query_one(FindingsView).show(ckpt)
        self.query_one(RanksView).show(ckpt)
        tags = Text()
        for t in reversed(ckpt.tags):
            tags.append("▶ " if t == ckpt.tag else "  ", style="bold")
            tags.append(shown(t), style="bold" if t == ckpt.tag else "")
            if t == latest:
                tags.append("  ★ latest", style="yellow")
            tags.append("\n")
        tags.append("[ and ] switch tags; the scan runs in the background.", style="dim")
        others = [r for r in ckpt.other_runs if r != os.path.basename(ckpt.root.rstrip(os.sep))]  # not this one
        if others:
            tags.append(f"\nOther Trainer checkpoints here: {shown(', '.join(others))}", style="dim")
        self.query_one("#tag-list", Static).update(tags)

    def clear(self) -> None:
        """Nothing of the previous checkpoint: a scan is running (or was refused)."""
        self._ckpt = None
        self.query_one("#banner", Static).add_class("-hidden")
        self.query_one(SummaryCard).forget("[italic]Scanning…[/]")
        self.query_one(FindingsView).update("")
        self.query_one(RanksView).forget()
        self.query_one("#tag-list", Static).update("")

    def failed(self, exc: InspectorError, choose: str = "") -> None:
        self.clear()
        banner = self.query_one("#banner", Static)
        banner.update(
            Text.assemble(
                (f"✖ {shown(exc.title)}: ", "bold"),
                shown(exc.message),
                f"\n→ {shown(exc.hint)}" if exc.hint else "",
                f"\n→ {choose}." if choose else "",
                "\nNothing of another checkpoint is shown, and nothing can be exported until one is read.",
            )
        )
        banner.remove_class("-hidden")
        self.query_one(SummaryCard).forget("")
