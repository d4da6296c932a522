"""The summary card: what this checkpoint is, in one screenful."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from inspector.scan.model import Checkpoint, Finding, Kind, Severity
from inspector.tui.fmt import KIND_STYLE, count, dtype, size
from inspector.tui.widgets.auto_height import AutoHeightStatic

_SEVERITY = {
    Severity.ERROR: ("✖ ERROR", "bold red"),
    Severity.WARNING: ("▲ WARN", "yellow"),
    Severity.INFO: ("● INFO", "cyan"),
}


def summary_table(ckpt: Checkpoint) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    t.add_row(
        "ZeRO",
        f"stage {ckpt.stage} · {ckpt.world_size} rank{'s' if ckpt.world_size != 1 else ''} · "
        f"{ckpt.optimizer}",
    )
    t.add_row("Dtypes", f"compute {dtype(ckpt.compute_dtype)} · master {dtype(ckpt.master_dtype)}")
    steps = []
    if ckpt.global_steps is not None:
        steps.append(f"step {ckpt.global_steps}")
    if ckpt.optimizer_step is not None:
        steps.append(f"optimizer step {ckpt.optimizer_step}")
    if ckpt.global_samples is not None:
        steps.append(f"{count(ckpt.global_samples)} samples")
    t.add_row("Training", " · ".join(steps) or "–")
    if ckpt.loss_scale is not None:
        t.add_row("Loss scale", f"{ckpt.loss_scale:g}" + (" (dynamic)" if ckpt.dynamic_loss_scale else ""))
    t.add_row("DeepSpeed", ckpt.deepspeed_version or "unknown")
    t.add_row("Files", f"{len(ckpt.files)} files · {size(ckpt.total_bytes)}")
    return t


def contents_table(ckpt: Checkpoint) -> Table:
    """Counts and bytes by kind: masters, moments, the 16-bit copy, frozen, buffers, padding."""
    t = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    t.add_column("what")
    t.add_column("tensors", justify="right")
    t.add_column("params", justify="right")
    t.add_column("bytes", justify="right")
    for kind in Kind:
        n, numel = ckpt.count(kind)
        if n:
            nbytes = sum(sum(s.nbytes for s in x.segments) for x in ckpt.tensors if x.kind is kind)
            label = {Kind.TRAINABLE: "fp32 masters" if ckpt.master_dtype == "float32" else "masters"}.get(
                kind, str(kind)
            )
            t.add_row(
                Text(label, style=KIND_STYLE[kind]),
                str(n),
                count(numel),
                size(nbytes) if kind is not Kind.TIED else "(alias)",
            )
    moments: dict[str, int] = {}
    for x in ckpt.tensors:
        if x.kind is Kind.TIED:  # an alias shares its owner's optimizer state
            continue
        for state, segs in x.moments:
            moments[state] = moments.get(state, 0) + sum(s.nbytes for s in segs)
    for state, nbytes in moments.items():
        t.add_row(Text(f"Adam {state}", style="blue"), "", "", size(nbytes))
    if ckpt.module_copy_bytes:
        t.add_row(
            Text(f"{dtype(ckpt.compute_dtype)} module copy", style="dim"),
            "",
            "",
            size(ckpt.module_copy_bytes),
        )
    pad = sum(g.padding for r in ckpt.ranks for g in r.groups)
    if pad:
        t.add_row(Text("padding", style="dim"), "", count(pad), "")
    return t


def findings_renderable(items: tuple[Finding, ...]) -> RenderableType:
    if not items:
        return Text(
            "✔ No problems found: every rank file is present, complete and from one run.", style="green"
        )
    lines = []
    for f in sorted(items, key=lambda f: list(Severity).index(f.severity)):
        label, style = _SEVERITY[f.severity]
        line = Text()
        line.append(f"{label:8} ", style=style)
        line.append(f.message)
        if f.file:
            line.append(f"\n         {f.file}", style="dim")
        if f.hint:
            line.append(f"\n         → {f.hint}", style="italic")
        lines.append(line)
    return Group(*lines)


class SummaryCard(AutoHeightStatic):
    """Stage, ranks, dtypes, optimizer, version, steps, loss scale and contents by kind."""

    DEFAULT_CSS = "SummaryCard { height: auto; }"

    _ckpt: Checkpoint | None = None

    def show(self, ckpt: Checkpoint) -> None:
        self._ckpt = ckpt
        self._draw()

    def on_resize(self) -> None:
        self._draw()  # one column below 100 cells, two above: decided by the size we really have

    def _draw(self) -> None:
        ckpt = self._ckpt
        if ckpt is None:
            return
        if self.app.size.width < 100:
            self.update(Group(summary_table(ckpt), Text(""), contents_table(ckpt)))
            return
        grid = Table.grid(padding=(0, 3))
        grid.add_column()
        grid.add_column()
        grid.add_row(summary_table(ckpt), contents_table(ckpt))
        self.update(grid)


class FindingsView(AutoHeightStatic):
    """Findings, errors first, each with what to do; red when anything is wrong."""

    DEFAULT_CSS = "FindingsView { height: auto; }"

    def show(self, ckpt: Checkpoint) -> None:
        self.set_class(bool(ckpt.errors), "-errors")
        self.update(findings_renderable(ckpt.findings))
