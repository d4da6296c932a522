"""The app as its screens and key actions see it: the state they share and the calls they make.

`app.py` builds every screen and calls `actions.py`, so a screen or an action that named `InspectorApp` back
closed an import circle (app -> actions -> app, app -> screens -> typed -> app). They name this base class
instead; `InspectorApp` extends it, and nothing in the package imports `app.py` but its front ends."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from textual.app import App
from textual.reactive import reactive

from inspector.convert.kinds import Job
from inspector.convert.options import ConvertOptions
from inspector.convert.preflight import Assessment
from inspector.errors import InspectorError
from inspector.scan.model import Checkpoint
from inspector.scan.tp_rules import Rules
from inspector.tui.selections import NamedSelections
from inspector.tui.session import ExportSettings


class Shell(App[int]):
    """What every screen may read of the app (set by `InspectorApp.__init__`) and the calls it may make."""

    # the export options: views that depend on them (the Tensors tab's output dtype and tied weights) watch
    # this instead of being told by the export screen
    base_options: reactive[ConvertOptions] = reactive(ConvertOptions, always_update=False, init=False)

    live_meters: bool  # tests and the screenshot script freeze meters and clocks
    roots: tuple[str, ...]
    root: str | None
    latest_tag: str | None
    ckpt: Checkpoint | None  # None while scanning and after a refusal: nothing to export
    tags: tuple[str, ...]
    refused: InspectorError | None  # why the shown root or tag has no checkpoint
    asked_tag: str | None
    selected: set[str]
    named: NamedSelections  # saved selections, per root (`m`; the Export form's Selection field)
    shown_only: frozenset[str] | None
    tp_split: Rules
    export: ExportSettings
    converting: bool
    frozen_assess: Callable[[Job], Assessment] | None
    clock: Callable[[], float]

    @property
    @abstractmethod
    def main(self) -> Any:
        """The main screen (the bottom of the stack); typed loosely so this module imports no screen."""

    @abstractmethod
    def begin(self) -> None: ...

    @abstractmethod
    def scan(self, root: str, tag: str | None = None) -> None: ...

    @abstractmethod
    def set_tp_split(self, rules: Rules) -> None: ...

    @abstractmethod
    def error(self, exc: InspectorError) -> None: ...

    @abstractmethod
    def set_selection(self, names: Iterable[str]) -> None: ...

    @abstractmethod
    def convert_options(self) -> ConvertOptions: ...

    @abstractmethod
    def saved_ago(self, ckpt: Checkpoint) -> str: ...

    @abstractmethod
    def out_dtype(self) -> str: ...

    @abstractmethod
    def stop_children(self) -> None: ...

    @abstractmethod
    def action_convert(self) -> None: ...
