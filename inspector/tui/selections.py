"""Named selections in the app: the user's (`m` saves what `e` would export, per checkpoint root, in the
state file `convert/selection_store.py` keeps, so they last between runs) beside the ones the layout proposes
for the shown checkpoint (`convert/selections.proposed`: per stage, expert, TP split group, frozen/trainable,
the LoRA adapter). The picker (`p`) and the Export form's Selection field list both; another tag of the same
root offers the saved ones too, narrowed to the tensors it has. `convert --selection NAME` resolves a name
through the same core functions, so both faces export the same tensors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from inspector.convert import selection_store as store
from inspector.convert.selections import Selection, checked_name, choices, resolve
from inspector.errors import InspectorError, InvalidOptionError
from inspector.scan.model import Checkpoint


@dataclass
class NamedSelections:
    """Root key -> name -> the tensors saved under it, read from the state file once and written on every
    save; `offered`: the shown checkpoint's proposals (set with each scan)."""

    folder: str | None = None  # the state folder; None: XDG's (`selection_store.state_folder`)
    persist: bool = True  # False: kept for this run only (nothing read or written)
    by_root: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    offered: tuple[Selection, ...] = ()
    _loaded: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def load(self) -> str:
        """Read the state file, the first time only (the scan worker calls this, off the UI thread); the
        problem to show when it was not usable, "" otherwise. Never raises: the selections start empty."""
        with self._lock:
            if self._loaded or not self.persist:
                return ""
            self._loaded = True
            try:
                roots = store.load(self.folder)
            except store.StateFileProblem as exc:
                return f"{exc.message} {exc.hint}"
            for key, names in roots.items():
                self.by_root.setdefault(key, {}).update({n: s.tensors for n, s in names.items()})
            return ""

    def save(self, root: str, name: str, tensors: set[str], tag: str = "") -> str:
        """Save (or replace) `name` for `root`: refused when empty or badly named (InvalidOptionError); kept
        for the run at once and written to the state file; what went wrong writing it, "" when it was saved."""
        if not tensors:
            raise InvalidOptionError(
                "Nothing is selected to save.", hint="Select tensors on the Tensors tab (space, a, v, /)."
            )
        name = checked_name(name)
        mine = self.by_root.setdefault(store.root_key(root), {})
        mine.pop(name, None)  # a replaced name moves to the end, as in the file
        mine[name] = frozenset(tensors)
        return self._write(lambda: store.save(root, name, tag, frozenset(tensors), self.folder))

    def forget(self, root: str, name: str) -> str:
        """Remove a saved selection (the picker's `d`); what went wrong writing the file, "" otherwise."""
        self.by_root.get(store.root_key(root), {}).pop(name, None)
        return self._write(lambda: store.forget(root, name, self.folder))

    def _write(self, change: Callable[[], object]) -> str:
        if not self.persist:
            return ""
        self.load()  # the file's other selections first, so the ones read later are not lost from view
        try:
            change()
        except (InspectorError, OSError) as exc:
            said = f"{exc.message} {exc.hint}" if isinstance(exc, InspectorError) else str(exc)
            return f"Kept for this run only: {said}"
        return ""

    def names(self, root: str | None) -> list[str]:
        """The names saved for `root`, in the order they were saved."""
        return list(self.by_root.get(store.root_key(root), {})) if root else []

    def listed(self, ckpt: Checkpoint) -> tuple[Selection, ...]:
        """What the picker and the Export form list for `ckpt`: the proposals, then the saved ones it has."""
        return choices(ckpt, self.by_root.get(store.root_key(ckpt.root), {}), self.offered)

    def pick(self, ckpt: Checkpoint, name: str) -> set[str]:
        """The tensors `name` selects in `ckpt` (InvalidOptionError when there is no such selection)."""
        return set(resolve(name, self.listed(ckpt)).tensors)
