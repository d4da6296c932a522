"""Detail of the focused tensor: where its bytes live, and its statistics once computed (`s`)."""

from __future__ import annotations

import math
import os

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from inspector.health.tensor import Difference, StatsProgress, TensorStats
from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.scan.summary import alignment_padding
from inspector.tui.fmt import KIND_STYLE, bar, count, dtype, plural, shape, shown, size
from inspector.tui.session import rank_of_file
from inspector.tui.widgets.auto_height import AutoHeightStatic

SPARK = " ▁▂▃▄▅▆▇█"


def _num(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{x:.4g}" if x == 0 or 1e-4 <= abs(x) < 1e5 else f"{x:.3e}"


def histogram_line(hist: tuple[int, ...]) -> str:
    top = max(hist, default=0) or 1
    return "".join(SPARK[min(8, math.ceil(8 * h / top))] if h else " " for h in hist)


def where_lines(ckpt: Checkpoint, t: TensorInfo, limit: int = 8) -> list[Text]:
    """One line per piece: who holds it, which file, at which byte offset, how many elements."""
    owner = rank_of_file(ckpt)
    lines = []
    for s in t.segments[:limit]:
        lines.append(
            Text.assemble(
                (f"{owner.get(s.file, '?'):>12} ", "bold"),
                (shown(os.path.basename(s.file)), "cyan"),
                f" @ byte {s.offset:,}",
                (f"  {count(s.numel)} elements, {size(s.nbytes)}", "dim"),
            )
        )
    rest = t.segments[limit:]
    if rest:
        lines.append(
            Text(
                f"{'…':>12} {len(rest)} more pieces: {count(sum(s.numel for s in rest))} elements, "
                f"{size(sum(s.nbytes for s in rest))}",
                style="dim",
            )
        )
    return lines


_RULE_WORDS = {  # the checkpoint's category rule (parse/layers.py's _RECIPES) -> how its shards join
    "replicated": "",
    "row": "split on dim 1",
    "vocab": "split on dim 0, the vocabulary's padding cut",
    "2-sub-params": "two sub-parameters, each split on dim 0",
    "average": "averaged over the shards",
}


def tp_split_words(ckpt: Checkpoint, name: str) -> str | None:
    """How a tensor-parallel parameter's shards join, as the scan joined it: "split on dim D", "" when each
    shard holds the same copy (replicated), None where no record says (the scan's default is dim 0)."""
    recipe = ckpt.parallel.tp_recipe if ckpt.parallel is not None else None
    joined = recipe.join_of(name) if recipe is not None else None
    if joined is None:
        return None
    how, what = joined
    if how == "split":
        return f"split on dim {', '.join(map(str, what))}"
    if how == "replicated":
        return ""
    if how == "sub-parameters":
        return f"sub-parameters, each split on dim {what[0]}"
    return _RULE_WORDS.get(str(what), f"joined as {what}")


def _tp_note(ckpt: Checkpoint, t: TensorInfo) -> str:
    """A ZeRO-3 tensor-parallel parameter: its TP shards, each partitioned over its data-parallel ranks (not
    "partitioned 4 ways", which hid the split)."""
    assert ckpt.parallel is not None
    tp, dp = ckpt.parallel.tp, max(ckpt.parallel.dp, 1)
    how = tp_split_words(ckpt, t.name)
    held: dict[str, int] = {}  # a rank's file -> its elements (a row-split shard is many strided pieces)
    for seg in t.segments:
        held[seg.file] = held.get(seg.file, 0) + seg.numel
    per = max(held.values(), default=0)
    if how == "":
        head = f"Replicated on the {tp} tensor-parallel shards (one copy is read)"
    else:
        split = f", {how}" if how else ", split on dim 0 unless a record says otherwise"
        head = f"{plural(tp, 'tensor-parallel shard')}{split}"
    ranks = plural(dp, "data-parallel rank")
    return f"{head}; each shard partitioned over {ranks}, up to {count(per)} per rank."


def padding_note(ckpt: Checkpoint, t: TensorInfo) -> str:
    if t.kind is not Kind.TRAINABLE:
        return "Not partitioned: saved whole in the model-states file." if t.kind is not Kind.TIED else ""
    if ckpt.stage == 3 and ckpt.parallel is not None and ckpt.parallel.tp > 1:
        return _tp_note(ckpt, t)
    if ckpt.stage == 3:
        per = math.ceil(t.numel / max(ckpt.world_size, 1))
        pad = per * ckpt.world_size - t.numel
        return f"Partitioned {plural(ckpt.world_size, 'way')}, {count(per)} per rank; {plural(pad, 'padding element')} on the last rank."
    g = next((g for g in ckpt.groups if g.index == t.group), None)
    if g is None:
        return ""
    align = sum(n for (_, grp), n in alignment_padding(ckpt).items() if grp == g.index)
    end = g.padded_numel - g.numel - align
    where = f"{plural(end, 'padding element')} at its end" + (
        f" and {plural(align, 'alignment padding element')} between parameters (param_alignment_paddings)"
        if align
        else ""
    )
    # a pipeline stage's or an expert-parallel rank's group is split over its own data-parallel ranks
    ways = g.padded_numel // g.partition_numel if g.partition_numel else ckpt.world_size
    text = f"Part of group {g.index}'s flat buffer ({count(g.numel)} elements, split {plural(ways, 'way')}); the group has {where}."
    if ckpt.parallel is not None and ckpt.parallel.tp > 1:
        how = tp_split_words(ckpt, t.name)
        shards = plural(ckpt.parallel.tp, "tensor-parallel shard")
        if how == "":
            text = f"Replicated on the {shards} (one copy is read); it is " + text[0].lower() + text[1:]
        else:
            split = f" ({how})" if how else ""
            text = f"Joined from {shards}{split}; each shard's piece is " + text[0].lower() + text[1:]
    return text


def stats_renderable(st: TensorStats, timed: bool = True) -> RenderableType:
    """The statistics table and histogram; `timed` adds how long the read took (a frozen app leaves it out,
    as it does the scan's time)."""
    t = Table.grid(padding=(0, 2))
    for _ in range(4):
        t.add_column()
    t.add_row("min", _num(st.minimum), "max", _num(st.maximum))
    t.add_row("mean", _num(st.mean), "std", _num(st.std))
    t.add_row("abs max", _num(st.absmax), "zeros", f"{st.zeros:,} ({st.zeros / max(st.numel, 1):.1%})")
    nan = Text(f"{st.nans:,}", style="bold red" if st.nans else "")
    inf = Text(f"{st.infs:,}", style="bold red" if st.infs else "")
    t.add_row("NaN", nan, "Inf", inf)
    hist = Text(histogram_line(st.histogram), style="cyan")
    return Group(
        t,
        Text.assemble(
            ("histogram ", "dim"), (_num(st.minimum), "dim"), " ", hist, " ", (_num(st.maximum), "dim")
        ),
        Text(f"read {count(st.numel)} values" + (f" in {st.seconds:.2f} s" if timed else ""), style="dim"),
    )


def difference_line(label: str, d: Difference) -> Text:
    style = "green" if d.differing == 0 else ("yellow" if d.relative_l2 < 0.05 else "bold yellow")
    if d.differing == 0:
        return Text.assemble((f"{label}: ", "bold"), ("identical", style))
    return Text.assemble(
        (f"{label}: ", "bold"),
        (f"max |Δ| {_num(d.max_abs)}", style),
        f" · mean |Δ| {_num(d.mean_abs)} · ‖Δ‖/‖x‖ {d.relative_l2:.2%} · {d.differing:,} of {d.numel:,} differ",
    )


class TensorDetail(AutoHeightStatic):
    """The focused tensor (or submodule summary) and, on demand, its statistics."""

    DEFAULT_CSS = "TensorDetail { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Move to a tensor to see where its bytes live.", id=id)
        self.ckpt: Checkpoint | None = None
        self.tensor: TensorInfo | None = None
        self.out_dtype = "float32"
        self.extra: list[RenderableType] = []

    def show(self, ckpt: Checkpoint, tensor: TensorInfo | None, out_dtype: str) -> None:
        if tensor is not self.tensor:
            self.extra = []
        self.ckpt, self.tensor, self.out_dtype = ckpt, tensor, out_dtype
        self.redraw()

    def show_module(self, title: str, lines: list[str]) -> None:
        self.tensor = None
        self.extra = []
        self.update(Group(Text(shown(title), style="bold"), *(Text(x) for x in lines)))

    def forget(self) -> None:
        self.ckpt, self.tensor, self.extra = None, None, []
        self.update("Move to a tensor to see where its bytes live.")

    def set_extra(self, items: list[RenderableType]) -> None:
        self.extra = items
        self.redraw()

    def progress(self, what: str, p: StatsProgress) -> None:
        self.set_extra(
            [
                Text.assemble(
                    (f"{what}… ", "italic"),
                    (bar(p.fraction, 20), "cyan"),
                    f" {p.fraction:.0%}  (escape cancels)",
                )
            ]
        )

    def redraw(self) -> None:
        ckpt, t = self.ckpt, self.tensor
        if ckpt is None or t is None:
            return
        head = Text(shown(t.name), style="bold")
        out = dtype(self.out_dtype if t.is_floating else t.dtype)
        line = Text.assemble(
            f"{shape(t.shape)} · {count(t.numel)} params · ",
            (str(t.kind), KIND_STYLE[t.kind]),
            f" · source {dtype(t.segments[0].dtype if t.segments else t.dtype)} → out {out}",
            f" · group {t.group}" if t.group is not None else "",
        )
        parts: list[RenderableType] = [head, line]
        if t.alias_of:
            parts.append(
                Text(
                    f"Tied: the same storage as {shown(t.alias_of)}; written under both names unless deduplicated.",
                    style="yellow",
                )
            )
        if t.segments:
            parts += [Text("Where the bytes live", style="bold underline"), *where_lines(ckpt, t)]
        note = padding_note(ckpt, t)
        if note:
            parts.append(Text(note, style="dim"))
        if t.moments:
            parts.append(
                Text(
                    "Optimizer state beside it: "
                    + ", ".join(m for m, _ in t.moments)
                    + " (same layout, not exported)",
                    style="dim",
                )
            )
        parts.append(Text("Statistics", style="bold underline"))
        parts += self.extra or [Text("press s to read this tensor's values and compute them", style="dim")]
        self.update(Group(*parts))
