"""Inert stand-ins for the classes a DeepSpeed pickle names: they keep state, they never run code."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import Any


class Record:
    """An inert stand-in for a pickled object: keeps its qualname, constructor args and state."""

    _qualname = "Record"

    def __new__(cls, *args: Any, **kwargs: Any) -> Record:
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args: Any) -> None:
        self.__dict__["_args"] = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(_safe_attrs(type(self), state))
        else:
            self.__dict__["_state"] = state

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)

    def __repr__(self) -> str:
        fields = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return f"{self._qualname}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def _safe_attrs(cls: type, state: dict[Any, Any]) -> dict[str, Any]:
    """Instance attributes a pickle may set: never ones that would shadow a method (`get`, `__setstate__`).

    Otherwise a crafted BUILD could make `scaler.get(...)` or a later BUILD call whatever the pickle chose.
    """
    return {
        k: v
        for k, v in state.items()
        if isinstance(k, str) and not k.startswith("__") and not hasattr(cls, k)
    }


class _OrderedDict(OrderedDict):  # type: ignore[type-arg]
    """`collections.OrderedDict` for the unpickler. state_dict()s carry a `_metadata` attribute, set by BUILD;
    keep such attributes but never let them shadow dict methods (`get`, `items`, ...)."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(_safe_attrs(type(self), state))


_OrderedDict.__name__ = _OrderedDict.__qualname__ = "OrderedDict"  # reprs read like the real thing


def _bytearray(source: Any = b"", *args: Any) -> bytearray:
    """`bytearray` from pickled bytes only: `bytearray(10**12)` would allocate on the pickle's say-so."""
    if isinstance(source, int):
        raise pickle.UnpicklingError("bytearray(<int>) in a pickle")
    return bytearray(source, *args)


def _record_class(module: str, name: str) -> type[Record]:
    return type(name, (Record,), {"_qualname": f"{module}.{name}", "__module__": "inspector.format.torchzip"})


class ZeroStage(int):
    """`ZeroStageEnum` read back as an int (0=disabled, 1=optimizer_states, 2=gradients, 3=weights)."""

    __slots__ = ()  # no instance __dict__ for a pickle's BUILD to fill

    def __repr__(self) -> str:
        return f"ZeroStage({int(self)})"


class InertDict(dict):  # type: ignore[type-arg]
    """Stand-in for dict subclasses (e.g. Lightning's AttributeDict): items kept, methods not."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.update(state)


class _Token:
    """A named marker (a dtype, a storage type, `torch.Tensor`) that is referenced but never called."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _safe_encode(obj: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles spell `bytes` as `_codecs.encode(str, 'latin1')`; allow only that."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode used for something other than bytes")
    return obj.encode("latin1")


def _size(dims: Any = ()) -> tuple[int, ...]:
    return tuple(map(int, dims))
