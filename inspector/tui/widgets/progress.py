"""The conversion's progress block: overall bar and line, the current shard's bar, the current tensor.

Fed with the child's JSON `progress` events (`show`). The shard and tensor lines are one row each, cropped:
a long tensor name that wrapped made everything below it jump with every event.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from inspector.tui.fmt import duration, size


class ConvertProgress(Vertical):
    DEFAULT_CSS = """
    ConvertProgress { height: auto; }
    ConvertProgress ProgressBar { width: 100%; }
    ConvertProgress ProgressBar Bar { width: 1fr; }
    ConvertProgress #shard-label, ConvertProgress #tensor-text { height: 1; }
    ConvertProgress #tensor-text { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Overall", classes="section")
        yield ProgressBar(show_eta=False, id="overall")
        yield Static("", id="overall-text")
        yield Static("", id="shard-label")
        yield ProgressBar(show_eta=False, id="shard")
        yield Static("", id="tensor-text")

    def start(self, total: int | None) -> None:
        """A new run: `total` bytes (None: unknown until the first event)."""
        self.query_one("#overall", ProgressBar).update(total=total, progress=0)

    def say(self, line: str | Text) -> None:
        """Replace the overall line (starting, cancelling, verified)."""
        self.query_one("#overall-text", Static).update(line)

    def complete(self) -> None:
        bar = self.query_one("#overall", ProgressBar)
        bar.update(total=bar.total or 1, progress=bar.total or 1)

    def show(self, ev: dict[str, Any], *, verifying: bool) -> None:
        """One `progress` event: bytes done of total, throughput, ETA; the shard and tensor in hand."""
        done, total = int(ev.get("bytes_done", 0)), int(ev.get("bytes_total", 0)) or 1
        rate = float(ev.get("throughput", 0.0))
        eta = (total - done) / rate if rate > 0 else float("nan")
        with self.app.batch_update():
            self.query_one("#overall", ProgressBar).update(total=total, progress=done)
            self.say(
                f"{size(done)} of {size(total)} {'verified' if verifying else 'written'} · {size(rate)}/s · "
                f"ETA {duration(eta)} · elapsed {duration(float(ev.get('elapsed', 0.0)))}"
            )
            if "shard" in ev and not verifying:
                self.query_one("#shard-label", Static).update(
                    f"Shard {int(ev.get('shard_index', 0)) + 1} of {ev.get('shards', 1)}: {ev['shard']}",
                    layout=False,
                )
                self.query_one("#shard", ProgressBar).update(
                    total=max(int(ev.get("shard_total", 1)), 1), progress=int(ev.get("shard_done", 0))
                )
            self.query_one("#tensor-text", Static).update(
                Text.assemble(("tensor ", "dim"), ev.get("tensor") or "–"), layout=False
            )
