"""Export options (`e`): output folder, format, dtype, shard size, renames, tied/frozen choices, validated as
you type, with a preflight panel that follows every change."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Checkbox, Header, Input, Label, Select, Static

from inspector.convert.kinds import DEFAULT, Job, get
from inspector.convert.options import DTYPE_ALIASES, ConvertOptions
from inspector.convert.preflight import Assessment
from inspector.errors import InspectorError
from inspector.remote.roots import absolute
from inspector.scan.tp_rules import Rules, parse_rules, rules_text
from inspector.system.units import parse_size
from inspector.tui.fmt import plural, shown, shown_markup
from inspector.tui.jobs import run_preflight
from inspector.tui.screens.export_fields import (
    apply_named,
    form_remedy,
    format_options,
    human_size,
    named_fields,
    parse_renames,
    shows_tp_split,
    split_list,
    tp_split_note,
)
from inspector.tui.session import exported
from inspector.tui.typed import zi
from inspector.tui.widgets.auto_height import AutoHeightStatic
from inspector.tui.widgets.keybar import KeyBar
from inspector.tui.widgets.preflight import PreflightPanel
from inspector.tui.widgets.safe_input import SafeInput

DTYPES = [("auto (training compute dtype)", "auto"), ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")]
# where the converter runs: this machine, or its parts as tasks on a Ray cluster (convert --executor ray)
RUN_ON = [("this machine", ""), ("a Ray cluster (its parts as tasks)", "ray")]


@dataclass
class PreflightDone(Message):
    generation: int
    plan: Job | None
    assessment: Assessment | None
    error: str = ""


class ExportScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("c", "convert", "Convert"),
        Binding("ctrl+s", "convert", "Convert", key_display="^s"),  # shown while typing in a field
    ]

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0
        self.plan_error = ""  # the preflight's refusal of valid-looking options (a rename collision)
        self.tp_error = ""  # why the TP-split rules as typed do not read
        self.ram = ""  # "Fits in RAM" as typed (preflight --ram); "": this machine

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="export-body"):
            with VerticalScroll(id="export-form"), Grid(id="form-grid"):
                yield from self._output_fields()
                yield from self._tp_fields()
                yield from self._naming_fields()
                yield from self._run_fields()
            with Vertical(id="export-side"):
                # above the preflight, not below the fields: at 80x24 the form scrolls and its end is below the
                # fold, where a ✖ was never seen; here it shows beside or under the form at every size
                yield AutoHeightStatic("", id="form-errors")
                yield Static("Preflight", classes="section")
                yield PreflightPanel(id="preflight")
                yield AutoHeightStatic("", id="selection-summary")
        yield KeyBar()

    def _output_fields(self) -> ComposeResult:
        """Where, in which kind, dtype and shard size: the form's first rows."""
        app = zi(self)
        o: ConvertOptions = app.base_options
        ex = app.export
        yield Label("Output folder")
        yield SafeInput(
            ex.out_dir,
            id="out",
            compact=True,
            placeholder="where the safetensors go",
            select_on_focus=False,
        )
        yield from named_fields(app)  # a named selection (proposed, or saved with `m`) for this export
        yield Label("Format")  # (its label and field in one grid row: nothing may come between them)
        formats, default, _ = format_options(app.ckpt)
        chosen = ex.format if ex.format in {v for _, v in formats} else default
        yield Select(formats, value=chosen, allow_blank=False, id="format", compact=True)
        yield Static("", classes="format-note")  # why other kinds are not offered: `_refresh_formats`
        yield Static("", id="format-note", classes="dim-note format-note", markup=False)
        yield Label("Base model", classes="base-row")  # shown for a kind that reads one (`_show_rows`)
        yield SafeInput(
            ex.base, id="base", compact=True, select_on_focus=False, classes="base-row",
            placeholder="base model folder (blank: adapter_config.json's)",
        )
        yield Label("Dtype")
        yield Select(
            DTYPES,
            value=o.dtype if o.dtype in {v for _, v in DTYPES} else "auto",
            allow_blank=False,
            id="dtype",
            compact=True,
        )
        yield Label("Fits in RAM")  # preflight --ram: judged for a node of that size, not this machine
        yield Input("", id="ram", compact=True, placeholder="blank: this machine; 16GB: a node of that size")
        yield Label("Shard size")
        yield Input(
            human_size(o.shard_size),
            id="shard",
            compact=True,
            placeholder="5GB (=5·10⁹ B, as HF), 2GiB, 500MB",
        )

    def _tp_fields(self) -> ComposeResult:
        """The TP-split rules in force (`--tp-split`), for a tensor-parallel checkpoint or when some are given:
        editable, read as the CLI reads them, and the tag scanned again with them."""
        app = zi(self)
        if not shows_tp_split(app.ckpt, app.tp_split):
            return
        yield Label("TP splits")
        yield Input(
            rules_text(app.tp_split),
            id="tp-split",
            compact=True,
            placeholder="PATTERN=0|1|replicated; … e.g. *.o_proj.weight=1; *=0",
        )
        yield Static("")
        yield Static(tp_split_note(app.ckpt, app.tp_split), id="tp-note", classes="dim-note", markup=False)

    def _naming_fields(self) -> ComposeResult:
        """What the tensors are called and which stay fp32."""
        o: ConvertOptions = zi(self).base_options
        yield Label("Strip prefix")
        yield Input(
            ", ".join(o.strip_prefix),
            id="strip",
            compact=True,
            placeholder="module., _forward_module.",
        )
        yield Label("Renames")
        yield Input(
            "; ".join(f"{p}={r}" for p, r in o.renames),
            id="renames",
            compact=True,
            placeholder=r"REGEX=REPL; ... e.g. ^model\.=",
        )
        yield Label("Keep fp32")
        yield Input(", ".join(o.keep_fp32), id="keep", compact=True, placeholder="*norm*, *.bias")

    def _run_fields(self) -> ComposeResult:
        """Where the converter runs, and the yes/no choices."""
        app = zi(self)
        o: ConvertOptions = app.base_options
        ex = app.export
        yield Label("Run on")
        yield Select(RUN_ON, value=ex.executor, allow_blank=False, id="executor", compact=True)
        yield Label("Ray address")
        yield Input(
            ex.ray_address,
            id="ray-address",
            compact=True,
            placeholder="blank: RAY_ADDRESS, else a local Ray",
        )
        for sid, label, value in (
            ("frozen", "leave out frozen parameters", o.exclude_frozen),
            ("buffers", "leave out buffers", o.exclude_buffers),
            ("dedupe", "store tied weights once (alias recorded in the header)", o.dedupe_tied),
            ("overwrite", "replace an earlier conversion in the output folder", ex.overwrite),
        ):
            yield Checkbox(label, value, id=sid, compact=True, classes="wide")

    def on_mount(self) -> None:
        self.sub_title = "Export options"
        # the form opens on a choice, not in a text field: `?` is help here (typed into a field it is text), and
        # the proposed folder is not selected for the first key to replace it
        self.query_one("#format", Select).focus()
        self._refresh_formats()
        self._changed()

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Checkbox.Changed)
    def _on_change(self) -> None:
        self._changed()

    def read_form(self) -> tuple[ConvertOptions, str, bool, list[str]]:
        """The options as typed, the output folder, overwrite, and every problem found."""
        app = zi(self)
        errors: list[str] = []
        base: ConvertOptions = app.base_options
        val = {w.id: w.value for w in self.query(Input)}
        dtype = self.query_one("#dtype", Select).value
        try:
            shard = parse_size(str(val["shard"]).strip())
            if shard <= 0:
                raise ValueError("the shard size must be positive")
        except ValueError as exc:
            errors.append(f"Shard size: {exc}")
            shard = base.shard_size
        try:
            renames = parse_renames(str(val["renames"]))
        except ValueError as exc:
            errors.append(f"Renames: {exc}")
            renames = base.renames
        self.ram = str(val["ram"]).strip()
        try:
            if self.ram and parse_size(self.ram) <= 0:
                raise ValueError("the RAM must be positive")
        except ValueError as exc:
            errors.append(f"Fits in RAM: {exc}")
        out = absolute(str(val["out"]).strip()) if str(val["out"]).strip() else ""  # a folder or s3://…
        if not out:
            errors.append("Output folder: required")
        elif os.path.exists(out) and not os.path.isdir(out):
            errors.append(f"Output folder: {out} is a file")
        overwrite = self.query_one("#overwrite", Checkbox).value
        if self.query_one("#executor", Select).value == "ray" and importlib.util.find_spec("ray") is None:
            errors.append("Run on: Ray is not installed (pip install 'zero-inspector[ray]')")
        if self.read_tp_split() is None:
            errors.append(f"TP splits: {self.tp_error}")
        kind = get(str(self.query_one("#format", Select).value) or DEFAULT)
        base_dir = str(val["base"]).strip()
        if kind.takes_base and base_dir and not os.path.isdir(os.path.expanduser(base_dir)):
            errors.append(f"Base model: {base_dir} is not a folder. Give the base model's folder.")
        if out and app.ckpt is not None and (busy := kind.busy(app.ckpt, out, overwrite)):
            errors.append(f"Output folder: {busy} (switch on overwrite to replace an earlier conversion)")
        opts = replace(
            base,
            dtype=str(dtype) if str(dtype) in DTYPE_ALIASES or dtype == "auto" else "auto",
            shard_size=shard,
            strip_prefix=split_list(str(val["strip"])),
            renames=renames,
            keep_fp32=split_list(str(val["keep"])),
            exclude_frozen=self.query_one("#frozen", Checkbox).value,
            exclude_buffers=self.query_one("#buffers", Checkbox).value,
            dedupe_tied=self.query_one("#dedupe", Checkbox).value,
        )
        return opts, out, overwrite, errors

    def read_tp_split(self) -> Rules | None:
        """The TP-split rules as typed (the ones in force when the form has no such row); None when they do
        not read (`tp_error` says why)."""
        fields = self.query("#tp-split").results(Input)
        field = next(fields, None)
        if field is None:
            return zi(self).tp_split
        try:
            return parse_rules(field.value)
        except ValueError as exc:
            self.tp_error = str(exc)
            return None

    def rescanned(self) -> None:
        """The tag was scanned again (new TP-split rules): say what is in force, then check everything."""
        app = zi(self)
        for note in self.query("#tp-note").results(Static):
            note.update(tp_split_note(app.ckpt, app.tp_split))
        if app.ckpt is not None:
            self._refresh_formats()
        self._changed()

    def _show_errors(self, errors: list[str]) -> None:
        """✖ per problem (the form's and the preflight's), or ✔ when there is none."""
        box = self.query_one("#form-errors", Static)
        box.update(
            "\n".join(f"[red]✖[/] {shown_markup(e)}" for e in errors)
            if errors
            else "[green]✔ options valid[/]"
        )

    def _changed(self) -> None:
        apply_named(self)
        opts, out, overwrite, errors = self.read_form()
        app = zi(self)
        self.plan_error = ""  # the next preflight says again
        self._show_errors(errors)
        app.base_options = opts
        fmt = str(self.query_one("#format", Select).value)
        self._show_rows(fmt)
        base = str(self.query_one("#base", Input).value).strip()
        app.export = replace(
            app.export,
            base=os.path.abspath(os.path.expanduser(base)) if base else "",
            out_dir=out or app.export.out_dir,
            overwrite=overwrite,
            format=fmt,
            executor=str(self.query_one("#executor", Select).value),
            ray_address=str(self.query_one("#ray-address", Input).value).strip(),
        )
        self.generation += 1
        self.query_one("#selection-summary", Static).update("")  # the last plan's notes: not this one's
        if errors:  # a verdict on other options than those typed would be a lie (a green "Fits" for "lots")
            self.query_one(PreflightPanel).waiting("Preflight waits for valid options (✖ above).")
            return
        if app.ckpt is None:  # scanning again with new TP-split rules: no plan until it is done
            self.query_one(PreflightPanel).waiting("Scanning the tag with the TP-split rules…")
            return
        new_rules = self.read_tp_split() != app.tp_split  # applied once typing pauses, selection or not
        if not new_rules and not exported(app.selected, app.shown_only) and get(fmt or DEFAULT).uses_selection:
            self.query_one(PreflightPanel).error("Nothing selected is shown: choose tensors on the Tensors tab.")
            return
        self.query_one(PreflightPanel).pending()
        self.set_timer(0.2, lambda g=self.generation: self._maybe_preflight(g))

    def _refresh_formats(self) -> None:
        """The kinds the last scan allows, and why the others are not (universal once a TP split is known)."""
        formats, default, missing = format_options(zi(self).ckpt)
        select, value = self.query_one("#format", Select), self.query_one("#format", Select).value
        with self.prevent(Select.Changed):
            select.set_options(formats)
            select.value = value if value in {v for _, v in formats} else default
        for w in self.query(".format-note"):
            w.display = bool(missing)
        self.query_one("#format-note", Static).update("; ".join(missing))

    def _show_rows(self, fmt: str) -> None:
        """The Base model row only for a kind that reads a base (a merge), as `--base` is only for it."""
        for w in self.query(".base-row"):
            w.display = get(fmt or DEFAULT).takes_base

    def _maybe_preflight(self, generation: int) -> None:
        if generation == self.generation:
            app = zi(self)
            if self._apply_tp_split():
                return  # the form is checked again once the tag is scanned with them (`rescanned`)
            self._preflight(generation, app.convert_options(), app.export.out_dir)

    def _apply_tp_split(self) -> bool:
        """New valid TP-split rules go to the app, which scans the tag again with them; True if they did."""
        app = zi(self)
        rules = self.read_tp_split()
        if rules is None or rules == app.tp_split:
            return False
        self.query_one(PreflightPanel).waiting("Scanning the tag with the TP-split rules…")
        app.set_tp_split(rules)
        return True

    @work(thread=True, exclusive=True, group="preflight", exit_on_error=False, description="preflight")
    def _preflight(self, generation: int, opts: ConvertOptions, out_dir: str) -> None:
        try:
            plan, a = run_preflight(self.app, opts, out_dir, ram=self.ram)
            a.estimated_seconds  # noqa: B018  calibrated here (probes, 0.1 s watching the load), not on the UI
        except InspectorError as exc:
            said = f"{exc.title}: {exc.message} {form_remedy(exc.hint)}".strip()
            self.post_message(PreflightDone(generation, None, None, said))
            return
        self.post_message(PreflightDone(generation, plan, a))

    @on(PreflightDone)
    def _preflight_done(self, msg: PreflightDone) -> None:
        if msg.generation != self.generation:
            return
        panel = self.query_one(PreflightPanel)
        if msg.plan is None or msg.assessment is None:
            panel.error(msg.error)
            self.plan_error = msg.error
            self._show_errors([msg.error])
            return
        panel.show(msg.assessment, msg.plan)
        if not msg.plan.uses_selection:
            self.query_one("#selection-summary", Static).update(Text(" ".join(msg.plan.notes), style="dim"))
            return
        opts = zi(self).convert_options()
        flags = [f"--include {p}" for p in opts.include] + [f"--exclude {p}" for p in opts.exclude]
        self.query_one("#selection-summary", Static).update(
            f"[dim]Selection: {plural(msg.plan.tensor_count, 'tensor')} → {plural(len(msg.plan.files), 'file')}"
            + (f"\n= {shown_markup(' '.join(flags)[:200])}" if flags else " (everything)")
            + "".join(f"\n{shown_markup(note)}" for note in msg.plan.notes)  # why a count differs, in words
            + "[/]"
        )

    def action_convert(self) -> None:
        _, _, _, errors = self.read_form()
        errors += [self.plan_error] if self.plan_error else []
        if errors:
            self.notify(shown(errors[0]), title="Fix the options first", severity="error", markup=False)
            return
        if self._apply_tp_split():
            self.notify("Scanning the tag with the new TP-split rules first.", title="Not yet", markup=False)
            return
        zi(self).action_convert()
