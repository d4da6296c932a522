"""The conversion's progress block: overall bar and line, the current shard's bar, the current tensor.

Fed with the child's JSON `progress` events (`show`). The shard and tensor lines are one row each, cropped:
a long tensor name that wrapped made everything below it jump with every event.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from inspector.convert.events import Progressed
from inspector.tui.fmt import duration, estimate, plural, shown, size
from inspector.tui.widgets.auto_height import AutoHeightStatic

SHARD_ROWS = 8


def shard_rows(files: list[tuple[str, int]], current: int, fraction: float, rows: int = SHARD_ROWS) -> Text:
    """The output files as lines: written ✔, being written ▶ with its percent, to come ·. More files than
    `rows`: a window that keeps the one being written in view, with counts for what is above and below."""
    n = len(files)
    start = 0 if n <= rows else min(max(current - 2, 0), n - rows + 2)
    end = n if n <= rows else min(n, start + rows - 2)
    lines = []
    if start:
        lines.append(Text(f"  ✔ {plural(start, 'earlier file')} written", style="green"))
    for i in range(start, end):
        name, nbytes = files[i]
        if i < current:
            mark, style, note = "✔", "green", ""
        elif i == current:
            mark, style, note = "▶", "bold", f"  {fraction:.0%}"
        else:
            mark, style, note = "·", "dim", ""
        name_style = "" if i == current else style
        lines.append(
            Text.assemble((f"  {mark} ", style), (name, name_style), f"  {size(nbytes)}", (note, "bold"))
        )
    if end < n:
        lines.append(Text(f"  · {plural(n - end, 'more file')} to come", style="dim"))
    return Text("\n").join(lines)


class ConvertProgress(Vertical):
    DEFAULT_CSS = """
    ConvertProgress { height: auto; }
    ConvertProgress ProgressBar { width: 100%; }
    ConvertProgress ProgressBar Bar { width: 1fr; }
    ConvertProgress #shard-label, ConvertProgress #tensor-text { height: 1; }
    ConvertProgress #files { height: auto; }
    ConvertProgress #tensor-text { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Overall", classes="section")
        yield ProgressBar(show_eta=False, id="overall")
        yield AutoHeightStatic("", id="overall-text")
        yield Static("", id="shard-label")
        yield ProgressBar(show_eta=False, id="shard")
        yield Static("", id="tensor-text")
        yield Static("Output files", classes="section -hidden", id="files-title")
        yield AutoHeightStatic("", id="files", classes="-hidden")

    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, int]] = []
        self._index: dict[str, int] = {}  # listed file name -> its row
        self._shown = (-1, -1)  # (file, percent) last drawn: the list is redrawn only when that changes

    def start(self, total: int | None, files: list[tuple[str, int]] | None = None) -> None:
        """A new run: `total` bytes (None: unknown until the first event); `files` (name, bytes) are listed
        when there are several (a 70B model's thirty shards), each marked as it is written."""
        self.query_one("#overall", ProgressBar).update(total=total, progress=0)
        self.files = list(files or [])
        self._index = {name: i for i, (name, _) in enumerate(self.files)}
        self._shown = (-1, -1)
        many = len(self.files) > 1
        self.query_one("#files-title").set_class(not many, "-hidden")
        self.query_one("#files", Static).set_class(not many, "-hidden")
        if many:
            self._draw_files(0, 0.0)

    def _draw_files(self, current: int, fraction: float) -> None:
        key = (current, int(fraction * 100))
        if key != self._shown:
            self._shown = key
            self.query_one("#files", Static).update(shard_rows(self.files, current, fraction))

    def say(self, line: str | Text) -> None:
        """Replace the overall line (starting, cancelling, verified)."""
        self.query_one("#overall-text", Static).update(line)

    def complete(self) -> None:
        bar = self.query_one("#overall", ProgressBar)
        bar.update(total=bar.total or 1, progress=bar.total or 1)

    def written(self, reused: int = 0) -> None:
        """The conversion finished: every listed file is written (`reused`: that many kept from an earlier run)."""
        if len(self.files) > 1:
            self._draw_files(len(self.files), 1.0)
            again = f" ({reused} reused from an earlier run)" if reused else ""
            self.query_one("#shard-label", Static).update(
                f"{len(self.files)} of {len(self.files)} files written{again}"
            )

    def _show_file(self, ev: Progressed) -> None:
        """The files finished of those the header counted (one count everywhere; it never goes back while files
        are written side by side), and the file in hand, found in the listing by its name. An event for the
        whole output (a universal folder) is said as such."""
        index = self._index.get(ev.file, ev.file_index if ev.files == len(self.files) else -1)
        listed = len(self.files)
        if listed <= 1:
            label = f"Writing {ev.file}"
        elif index < 0:
            label = (
                f"{ev.files_done} of {listed} files written · writing {ev.file} (progress is for all of them)"
            )
        else:
            label = f"{ev.files_done} of {listed} files written · writing {ev.file}"
        self.query_one("#shard-label", Static).update(shown(label), layout=False)
        file_total = max(ev.file_total, 1)
        self.query_one("#shard", ProgressBar).update(total=file_total, progress=ev.file_done)
        if listed > 1 and index >= 0:
            self._draw_files(index, ev.file_done / file_total)

    def show(self, ev: Progressed, *, verifying: bool) -> None:
        """One `progress` event: bytes done of total, throughput, time left; the file and tensor in hand."""
        done, total = ev.bytes_done, ev.bytes_total or 1
        rate = ev.throughput
        eta = (total - done) / rate if rate > 0 else float("nan")
        left = f"{estimate(eta)} left" if rate > 0 else "time left unknown"
        with self.app.batch_update():
            self.query_one("#overall", ProgressBar).update(total=total, progress=done)
            self.say(
                f"{size(done)} of {size(total)} {'verified' if verifying else 'written'} · {size(rate)}/s · "
                f"{left} · elapsed {duration(ev.elapsed)}"
            )
            if ev.file and not verifying:
                self._show_file(ev)
            self.query_one("#tensor-text", Static).update(
                Text.assemble(("tensor ", "dim"), shown(ev.tensor) or "–"), layout=False
            )
