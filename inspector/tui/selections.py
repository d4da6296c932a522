"""Named selections in the app: the user's (`m` saves what `e` would export, per checkpoint root, in the
state file `convert/selection_store.py` keeps, so they last between runs) beside the ones the layout proposes
for the shown checkpoint (`convert/selections.proposed`: per stage, expert, TP split group, frozen/trainable,
the LoRA adapter). The picker (`p`) and the Export form's Selection field list both; another tag of the same
root offers the saved ones too, narrowed to the tensors it has. `convert --selection NAME` resolves a name
through the same core functions, so both faces export the same tensors."""

from __future__ import annotations

import threading
from collections import deque
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
    _pending: deque[Callable[[], object]] = field(default_factory=deque, repr=False)  # writes, oldest first
    _writing: threading.Lock = field(default_factory=threading.Lock, repr=False)

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
        """`keep`, then `write_next` in this thread: what went wrong writing the file, "" when it is saved."""
        self.keep(root, name, tensors, tag)
        return self.write_next()

    def forget(self, root: str, name: str) -> str:
        """`drop`, then `write_next` in this thread: what went wrong writing the file, "" otherwise."""
        self.drop(root, name)
        return self.write_next()

    def keep(self, root: str, name: str, tensors: set[str], tag: str = "") -> str:
        """Save (or replace) `name` for `root`: refused when empty or badly named (InvalidOptionError); kept
        for the run at once, its write to the state file queued for `write_next`; the name as checked."""
        if not tensors:
            raise InvalidOptionError(
                "Nothing is selected to save.", hint="Select tensors on the Tensors tab (space, a, v, /)."
            )
        name = checked_name(name)
        mine = self.by_root.setdefault(store.root_key(root), {})
        mine.pop(name, None)  # a replaced name moves to the end, as in the file
        mine[name] = kept = frozenset(tensors)
        self._pending.append(lambda: store.save(root, name, tag, kept, self.folder))
        return name

    def drop(self, root: str, name: str) -> None:
        """Remove a saved selection (the picker's `d`) for the run at once; its write queued."""
        self.by_root.get(store.root_key(root), {}).pop(name, None)
        self._pending.append(lambda: store.forget(root, name, self.folder))

    def write_next(self) -> str:
        """The oldest queued change written to the state file (locked, fsynced: the app calls this in a worker
        thread, one call per change): each call takes the oldest one under one lock, so the file sees the
        changes in the order they were made, whichever thread runs first. What went wrong, "" otherwise."""
        with self._writing:
            change = self._pending.popleft()
            return self._write(change)

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
