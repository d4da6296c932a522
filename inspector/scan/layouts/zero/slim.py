"""What the ranks' records of one ZeRO save share, so the scan's memory stays flat in the rank count: each
rank's optimizer and stage-3 model states keep rank 0's config and hyperparameter records where theirs are
equal, and a stage-3 model-states file of rank > 0 keeps no module (its placeholders are never read)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.dsconfig import DsConfig
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.metadata import config_key

_NO_MODULE: Mapping[str, TensorRef] = MappingProxyType({})


class Slim:
    """One scan's sharing: the first optimizer states seen, the config keys made, the records met."""

    def __init__(self) -> None:
        self._first: OptimStates | None = None  # whose shared values later ranks' records point to
        self._keys: dict[int, tuple[DsConfig, str]] = {}  # `key`'s: by record, the record kept
        self._seen: dict[int, Any] = {}  # `_met`'s records, by id, the object kept
        self._compared: dict[int, tuple[Any, Any, bool]] = {}  # `_equal`'s: by the first's id, both kept

    def optim(self, o: OptimStates, model: ModelStates) -> OptimStates:
        """A rank's optimizer states with the values every rank repeats (config, group hyperparameters)
        shared with rank 0's objects when equal, so the scan's memory stays flat in the rank count."""
        first = self._first = self._first or o
        config = o.ds_config
        if not self._met(config) and self.key(config) == self.key(model.ds_config):
            config = model.ds_config
        groups = tuple(
            replace(g, hyperparams=first.groups[i].hyperparams)
            if i < len(first.groups)
            and g.hyperparams is not first.groups[i].hyperparams  # one record already (parse.tree.once)
            and not self._met(g.hyperparams)
            and repr(dict(g.hyperparams)) == repr(dict(first.groups[i].hyperparams))
            else g
            for i, g in enumerate(o.groups)
        )
        if config is o.ds_config and all(map(operator.is_, groups, o.groups)):
            return o
        return replace(o, ds_config=config, groups=groups)

    def _met(self, value: Any) -> bool:
        """Whether this very object was in an earlier rank's records: the ranks one pickle rebuilds
        (format/replay.py) share their config and hyperparameter records, so the first is shared with rank
        0's and the rest keep theirs, already one object, without comparing them again. Remembers a few."""
        if self._seen.get(id(value)) is value:
            return True
        if len(self._seen) >= 64:
            self._seen.pop(next(iter(self._seen)))
        self._seen[id(value)] = value
        return False

    def _equal(self, a: Any, b: Any) -> bool:
        """`a == b`, compared once for the same two objects: the ranks whose records are read from one
        parse (`parse/reparse.py`) hold one `param_shapes` (a 126-layer model's 1,267 names and shapes, 30 us
        a comparison)."""
        if a is b:
            return True
        hit = self._compared.get(id(a))
        if hit is None or hit[0] is not a or hit[1] is not b:
            if len(self._compared) >= 64:
                self._compared.pop(next(iter(self._compared)))
            hit = self._compared[id(a)] = (a, b, a == b)
        return hit[2]

    def model(self, m: ModelStates, model: ModelStates) -> ModelStates:
        """Another rank's stage-3 model states as the scan keeps them: memory flat in the rank count. Its
        module holds only empty placeholders, which nothing reads (rank 0's name the tensors), and its config
        and parameter shapes, when they equal rank 0's, are rank 0's objects; everything the checks compare
        stays. The ranks one pickle rebuilds share one config record, so its key is made once."""
        same = not self._met(m.ds_config) and self.key(m.ds_config) == self.key(model.ds_config)
        config = model.ds_config if same else m.ds_config
        shapes = model.param_shapes if self._equal(m.param_shapes, model.param_shapes) else m.param_shapes
        if not m.module and config is m.ds_config and shapes is m.param_shapes:
            return m  # parsed without its module (`ZeroScanner`), sharing what the others share
        return replace(m, module=_NO_MODULE, ds_config=config, param_shapes=shapes)

    def key(self, config: DsConfig) -> str:
        """`config_key` of a parsed config, once per record: the ranks of one save share theirs (the
        consistency check compares them)."""
        hit = self._keys.get(id(config))
        if hit is None or hit[0] is not config:
            hit = self._keys[id(config)] = (config, config_key(config.raw))
        return hit[1]
