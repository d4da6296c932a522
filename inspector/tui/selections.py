"""Named selections: sets of tensors saved under a name (a pipeline stage, an expert, a TP shard) and picked
again for an export. Plain data, kept per checkpoint root for as long as the app runs, as the rest of the
session (the selection carried between tags, the export settings) is; another tag of the same root offers them
too, narrowed to the tensors it has."""

from __future__ import annotations

from dataclasses import dataclass, field

from inspector.errors import InvalidOptionError

NAME_LIMIT = 40  # cells: the name is shown in the export form's Selection field


def checked_name(text: str) -> str:
    """A selection's name as typed, or the refusal (empty, too long, a control character)."""
    name = text.strip()
    if not name:
        raise InvalidOptionError(
            "A selection needs a name.", hint="Type a name such as `stage 1` or `expert 3`."
        )
    if len(name) > NAME_LIMIT or not name.isprintable():
        raise InvalidOptionError(
            f"A selection's name is at most {NAME_LIMIT} printable characters.", hint="Type a shorter name."
        )
    return name


@dataclass
class NamedSelections:
    """Root -> name -> the tensors saved under it (what `e` would have exported when it was saved)."""

    by_root: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)

    def save(self, root: str, name: str, tensors: set[str]) -> None:
        """Save (or replace) `name` for `root`; an empty set is refused: it would export nothing."""
        if not tensors:
            raise InvalidOptionError(
                "Nothing is selected to save.", hint="Select tensors on the Tensors tab (space, a, v, /)."
            )
        self.by_root.setdefault(root, {})[checked_name(name)] = frozenset(tensors)

    def names(self, root: str | None) -> list[str]:
        """The names saved for `root`, in the order they were first saved."""
        return list(self.by_root.get(root or "", {}))

    def pick(self, root: str | None, name: str, present: set[str]) -> set[str]:
        """The tensors saved under `name` that the shown tag has (another tag may lack some)."""
        return set(self.by_root.get(root or "", {}).get(name, frozenset())) & present
