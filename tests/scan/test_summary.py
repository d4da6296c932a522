"""The plain-data summary rows both faces render (`scan` output and the TUI overview), on real demo checkpoints.

Figures are checked against what the demo wrote (file sizes on disk, the spec's steps and ranks, the
architecture's element counts) and, where a literal is clearer, against the exact text a user sees.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from inspector.demo.spec import DemoSpec, architecture
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from inspector.scan.summary import (
    ContentsRow,
    SummaryRow,
    contents_rows,
    kind_totals,
    parameter_count,
    rank_row,
    read_bytes_by_source,
    saved_at,
    summary_rows,
)

if TYPE_CHECKING:
    from conftest import DemoCache

S2 = DemoSpec(stage=2, world_size=2, dtype="bf16", params=100_000)
S1_FP16 = DemoSpec(stage=1, world_size=1, dtype="fp16", params=60_000)
S3 = DemoSpec(stage=3, world_size=4, dtype="bf16", params=100_000)
PLAIN = DemoSpec(stage=2, world_size=3, dtype="fp32", params=50_000, frozen=False, tied=False)


def _values(rows: list[SummaryRow]) -> dict[str, str]:
    return {r.key: r.value for r in rows}


def _mib(n: int) -> str:
    """format_bytes for the sizes asserted here (KiB to MiB), written out independently."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def test_summary_rows_stage2_bf16(demo: DemoCache) -> None:
    root = demo(S2)
    ckpt = scan(str(root))
    rows = summary_rows(ckpt)
    assert [r.key for r in rows] == [
        "root", "tag", "zero", "dtypes", "module_copy", "training", "loss_scale", "deepspeed", "files",
    ]  # fmt: skip
    assert [r.label for r in rows] == [
        "Checkpoint", "Tag", "ZeRO", "Dtypes", "Module copy", "Training", "Loss scale", "DeepSpeed", "Files",
    ]  # fmt: skip
    v = _values(rows)
    assert (v["root"], rows[0].note) == (str(root), "(deepspeed)")
    assert (v["tag"], rows[1].note) == ("global_step3", "tags: global_step3")
    assert v["zero"] == "stage 2 · 2 ranks · DeepSpeedZeroOptimizer"
    assert v["dtypes"] == "compute bfloat16 · master float32"
    assert v["training"] == f"global step 3 · optimizer step 3 · {3 * 4 * 2} samples"
    assert v["loss_scale"] == "1"
    assert v["deepspeed"] == ckpt.deepspeed_version
    on_disk = sum(os.path.getsize(f.path) for f in ckpt.files)
    assert on_disk == ckpt.total_bytes
    assert v["files"] == f"{len(ckpt.files)} files · {_mib(on_disk)}"
    # the 16-bit copy is half the masters' size, so a bf16 conversion can read it instead
    by = read_bytes_by_source(ckpt)
    assert by["module"] < by["masters"]
    assert v["module_copy"] == (
        f"{_mib(ckpt.module_copy_bytes)} of bfloat16 weights beside the fp32 masters; a bfloat16 conversion "
        f"reads {_mib(by['masters'])} from the masters, {_mib(by['module'])} with --source module"
    )
    assert all(not r.note for r in rows[2:])
    assert _values(summary_rows(ckpt, short_dtypes=True))["dtypes"] == "compute bf16 · master fp32"


def test_summary_rows_fp16_one_rank_and_stage3(demo: DemoCache) -> None:
    v = _values(summary_rows(scan(str(demo(S1_FP16)))))
    assert v["zero"] == "stage 1 · 1 rank · DeepSpeedZeroOptimizer"
    assert v["dtypes"] == "compute float16 · master float32"
    assert v["loss_scale"] == "256 (dynamic)"
    v3 = _values(summary_rows(scan(str(demo(S3)))))
    assert v3["zero"] == "stage 3 · 4 ranks · DeepSpeedZeroOptimizer_Stage3"
    assert v3["module_copy"] == "none (stage 3 saves placeholders; the masters are the only full copy)"
    assert v3["training"] == f"global step 3 · optimizer step 3 · {3 * 4 * 4} samples"


def test_summary_rows_without_steps_loss_scale_or_version_and_many_tags(demo: DemoCache) -> None:
    ckpt = replace(
        scan(str(demo(S2))),
        global_steps=None,
        optimizer_step=None,
        global_samples=None,
        loss_scale=None,
        deepspeed_version=None,
        tags=tuple(f"global_step{i}" for i in range(1, 10)),
    )
    rows = summary_rows(ckpt)
    v = _values(rows)
    assert "loss_scale" not in v
    assert v["training"] == "–"
    assert v["deepspeed"] == "unknown"
    assert rows[1].note == "tags: " + ", ".join(f"global_step{i}" for i in range(4, 10)) + " (+3 older)"


def test_kind_totals_match_the_architecture(demo: DemoCache) -> None:
    ckpt = scan(str(demo(S2)))
    params, tied = architecture(S2)
    totals = {k.kind: k for k in kind_totals(ckpt)}
    assert list(totals) == [Kind.TRAINABLE, Kind.FROZEN, Kind.BUFFER, Kind.TIED]
    for kind, name in ((Kind.TRAINABLE, "trainable"), (Kind.FROZEN, "frozen"), (Kind.BUFFER, "buffer")):
        ps = [p for p in params if p.kind == name and p.name not in tied]  # an alias counts as tied
        assert (totals[kind].tensors, totals[kind].numel) == (len(ps), sum(p.numel for p in ps))
    aliases = [p for p in params if p.name in tied]
    assert (totals[Kind.TIED].tensors, totals[Kind.TIED].numel) == (len(tied), sum(p.numel for p in aliases))
    assert (
        totals[Kind.TRAINABLE].nbytes
        == totals[Kind.TRAINABLE].stored_bytes
        == 4 * totals[Kind.TRAINABLE].numel
    )
    assert totals[Kind.FROZEN].nbytes == 2 * totals[Kind.FROZEN].numel  # bf16 in the model-states file
    # no frozen params and no tied weights: only the kinds present
    assert [k.kind for k in kind_totals(scan(str(demo(PLAIN))))] == [Kind.TRAINABLE, Kind.BUFFER]


def test_contents_rows(demo: DemoCache) -> None:
    ckpt = scan(str(demo(S2)))
    totals = {k.kind: k for k in kind_totals(ckpt)}
    masters = totals[Kind.TRAINABLE]
    pad = sum(g.padding for r in ckpt.ranks for g in r.groups)
    assert pad > 0  # odd hidden sizes: the flat groups need padding
    assert contents_rows(ckpt, short_dtypes=True) == [
        ContentsRow("trainable", "fp32 masters", masters.tensors, masters.numel, 4 * masters.numel),
        ContentsRow("frozen", "frozen", 1, totals[Kind.FROZEN].numel, totals[Kind.FROZEN].stored_bytes),
        ContentsRow("buffer", "buffer", 2, totals[Kind.BUFFER].numel, totals[Kind.BUFFER].stored_bytes),
        ContentsRow("tied", "tied", 1, totals[Kind.TIED].numel, None),  # an alias: its owner's bytes
        ContentsRow("moment", "Adam exp_avg", None, None, 4 * masters.numel),
        ContentsRow("moment", "Adam exp_avg_sq", None, None, 4 * masters.numel),
        ContentsRow("module_copy", "bf16 module copy", None, None, ckpt.module_copy_bytes),
        ContentsRow("padding", "padding", None, pad, None),
    ]
    assert contents_rows(ckpt)[6].what == "bfloat16 module copy"
    # stage 3 keeps no module copy; fp32 masters of an fp32 run are still "fp32 masters"
    assert "module_copy" not in [r.key for r in contents_rows(scan(str(demo(S3))))]
    assert contents_rows(scan(str(demo(PLAIN))))[0].what == "fp32 masters"


def test_rank_rows(demo: DemoCache, tmp_path: Path) -> None:
    ckpt = scan(str(demo(S3)))
    for r in ckpt.ranks:
        row = rank_row(r)
        assert row.rank == r.rank and row.complete
        assert row.files == tuple(os.path.basename(p) for p in (r.optim_file, r.model_file) if p)
        assert row.nbytes == sum(os.path.getsize(p) for p in (r.optim_file, r.model_file) if p)
        assert row.groups == tuple((g.stored_numel, g.padding) for g in r.groups)
        assert row.padding == sum(g.padding for g in r.groups)
        assert row.group_cells == [f"{s:,} / {p}" for s, p in row.groups]
    assert sum(rank_row(r).padding for r in ckpt.ranks) > 0
    # a rank whose optimizer-states file is gone: listed, not complete, no file names of its own
    root = demo.copy(S2, tmp_path / "ckpt")
    victim = next(root.rglob("*rank_1_mp_rank_00_optim_states.pt"))
    victim.unlink()
    row = rank_row(scan(str(root)).ranks[1])
    assert (row.rank, row.files, row.nbytes, row.complete) == (1, (), 0, False)


def test_every_face_reads_padding_from_the_rank_groups(demo: DemoCache) -> None:
    """Alignment padding between parameters has one source, `RankGroup.alignment` (the layout's count from the
    files): the rank rows, the contents row, `scan`'s ranks table, the app's ranks table and the tensor detail
    all show the same figures, so no view can contradict another or the files."""
    from rich.console import Console

    from inspector.cli.render import ranks_table as cli_ranks
    from inspector.scan.summary import alignment_padding
    from inspector.tui.widgets.ranks import ranks_table as tui_ranks
    from inspector.tui.widgets.tensor_detail import padding_note

    ckpt = scan(str(demo(S2)))
    extra = {0: 74, 1: 16}  # what param_alignment_paddings put in each rank's group-0 partition
    ranks = tuple(
        replace(r, groups=tuple(replace(g, alignment=extra[r.rank] if g.group == 0 else 0) for g in r.groups))
        for r in ckpt.ranks
    )
    ckpt = replace(ckpt, ranks=ranks)
    assert alignment_padding(ckpt) == {(0, 0): 74, (1, 0): 16}
    end = [r.groups[0].padding for r in ranks]
    cells = [rank_row(r).group_cells[0] for r in ranks]
    assert cells == [f"{ranks[i].groups[0].stored_numel:,} / {end[i]}+{extra[i]}" for i in (0, 1)]
    total = sum(g.padding for r in ranks for g in r.groups) + 90
    assert [(x.what, x.numel) for x in contents_rows(ckpt) if x.key == "padding"] == [
        ("padding (90 align)", total)
    ]

    def text(table: object) -> str:
        console = Console(width=200, record=True, color_system=None)
        console.print(table)
        return console.export_text()

    for shown in (text(cli_ranks(ckpt)), text(tui_ranks(ckpt))):
        assert all(cell in shown for cell in cells) and "param_alignment_paddings" in shown
    t = next(t for t in ckpt.tensors if t.kind is Kind.TRAINABLE and t.group == 0)
    assert "90 alignment padding elements between parameters" in padding_note(ckpt, t)


def test_parameter_count_is_trainable_and_frozen_with_each_tied_pair_once(demo: DemoCache) -> None:
    """Counted from the demo's own architecture: its parameters (frozen ones included), not its buffers, and a
    tied alias not a second time."""
    import math

    ckpt = scan(str(demo(S2)))
    params, tied = architecture(S2)
    expected = sum(
        math.prod(p.shape) for p in params if p.kind in ("trainable", "frozen") and p.name not in tied
    )
    assert tied and any(p.kind == "frozen" for p in params) and any(p.kind == "buffer" for p in params)
    assert parameter_count(ckpt) == expected


def test_saved_at_is_the_newest_rank_file_else_the_tag_folder(demo: DemoCache, tmp_path: Path) -> None:
    """The newest rank file's time as the scan recorded it; with no file time known, the tag folder's, read
    through the checkpoint's Source (a tag folder that is a link leading outside the checkpoint has none)."""
    root = demo.copy(S2, tmp_path / "ckpt")
    ckpt = scan(str(root))
    base = 1_700_000_000
    for i, f in enumerate(ckpt.files):
        os.utime(f.path, (base, base + 60 * i))
    os.utime(ckpt.tag_dir, (base, base - 3600))
    ckpt = scan(str(root))
    assert saved_at(ckpt) == base + 60 * (len(ckpt.files) - 1)
    unknown = replace(ckpt, files=tuple(replace(f, mtime_ns=0) for f in ckpt.files))
    assert saved_at(unknown) == base - 3600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(elsewhere, linked / ckpt.tag)
    assert saved_at(replace(unknown, root=str(linked), tag_dir=str(linked / ckpt.tag))) is None


def test_finding_lines_errors_first_hint_once_per_run_file_where_it_changes() -> None:
    from inspector.scan.model import Finding, Severity
    from inspector.scan.summary import finding_lines

    copy = "Copy the complete checkpoint folder."
    items = [
        Finding(Severity.WARNING, "w", "old", "/c/tag", "Look."),
        *(Finding(Severity.ERROR, "missing", f"rank {r} missing", "/c/tag", copy) for r in range(4)),
        Finding(Severity.ERROR, "torn", "cut off", "/c/tag/rank7.pt", copy),
        Finding(Severity.INFO, "i", "fyi", None, ""),
    ]
    lines, rest = finding_lines(items, shown_max=6)
    want = ["rank 0 missing", "rank 1 missing", "rank 2 missing", "rank 3 missing", "cut off", "old"]
    assert [x.message for x in lines] == want
    assert [x.file for x in lines] == ["/c/tag", "", "", "", "/c/tag/rank7.pt", "/c/tag"]
    assert [x.hint for x in lines] == ["", "", "", "", copy, "Look."]
    assert rest == 1  # the info finding, counted rather than dropped
