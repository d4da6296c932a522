"""Names and shapes in a pipeline checkpoint (FORMAT.md §3.6): the pipeline module's own parameter names
(`<layer>.<param>`, `tied_modules.<key>.<param>`), shapes recovered from the layer files where the optimizer
records none, which layer file holds a tied module, and the output order. Pure functions on parsed records."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from inspector.format.torchzip import TensorRef
from inspector.parse.layers import TensorFile
from inspector.parse.states import OptimStates
from inspector.scan.holding import TIED_PREFIX
from inspector.scan.layout import ParamShapes
from inspector.scan.model import Finding, Kind, Segment, Severity, TensorInfo

LAYER_NAME = re.compile(r"^(\d+)\.(.+)$")


def shapes_from_slices(states: list[OptimStates], layer_files: Mapping[int, TensorFile]) -> ParamShapes:
    """BF16_Optimizer with ZeRO off writes no param_shapes (FORMAT.md §2.2 B): the fragment maps name the
    parameters and place them (global offset r·P + start); the shapes come from the layer files (a tied
    module's from the one layer file no `<index>.<key>` name claims whose tensor has the same key and size).
    () when a name has no unambiguous shape."""
    out = []
    for g in range(len(states[0].groups)):
        part = max(partition(st, g) for st in states)
        where: dict[str, int] = {}
        numel: dict[str, int] = {}
        for r, st in enumerate(states):
            for name, start, n in st.groups[g].slices or ():
                if n:
                    where[name] = min(where.get(name, 1 << 62), r * part + start)
                    numel[name] = numel.get(name, 0) + n
        claimed = {int(m.group(1)) for n in where if (m := LAYER_NAME.match(n))}
        entries = []
        for name in sorted(where, key=lambda n: where[n]):
            shape = shape_in_layers(name, numel[name], layer_files, claimed)
            if shape is None:
                return ()
            entries.append((name, shape))
        out.append(tuple(entries))
    return tuple(out)


def partition(st: OptimStates, g: int) -> int:
    """The partition size of group `g` on this rank: BF16_Optimizer keeps full partitions and moments."""
    moments = st.groups[g].moments
    return moments["exp_avg"].numel if moments else st.groups[g].master.numel


def shape_in_layers(
    name: str, numel: int, layer_files: Mapping[int, TensorFile], claimed: set[int]
) -> tuple[int, ...] | None:
    if m := LAYER_NAME.match(name):
        lf = layer_files.get(int(m.group(1)))
        ref = lf.tensors.get(m.group(2)) if lf else None
        return ref.shape if ref is not None and ref.numel == numel else None
    if name.startswith(TIED_PREFIX):
        key = name[len(TIED_PREFIX) :].partition(".")[2]
        shapes = {
            lf.tensors[key].shape
            for i, lf in layer_files.items()
            if i not in claimed and key in lf.tensors and lf.tensors[key].numel == numel
        }
        return shapes.pop() if len(shapes) == 1 else None
    return None


def tied_layer_files(
    trainable: Mapping[str, TensorInfo], layer_files: Mapping[int, TensorFile]
) -> dict[int, str]:
    """Layer files that hold a tied module (`tied_modules.<key>`): none of their keys is a `<index>.<key>`
    parameter, and every floating key matches the tied module's parameter of the same name and shape."""
    tied: dict[str, dict[str, TensorInfo]] = {}
    for name, t in trainable.items():
        if name.startswith(TIED_PREFIX):
            module, _, param = name[len(TIED_PREFIX) :].partition(".")
            tied.setdefault(TIED_PREFIX + module, {})[param] = t
    out = {}
    for idx, lf in layer_files.items():
        if any(f"{idx}.{k}" in trainable for k in lf.tensors):
            continue
        for module, params in tied.items():
            if params and all(k in lf.tensors and lf.tensors[k].shape == t.shape for k, t in params.items()):
                out[idx] = module
                break
    return out


def lost_tied_files(
    trainable: Mapping[str, TensorInfo], found: Mapping[int, str], tag_dir: str
) -> list[Finding]:
    """An error per tied module no layer file holds: its file is gone (it has no `<index>.` name, so
    `missing_layers` cannot tell), and with it the module's 16-bit copy, which --source module reads."""
    tied = sorted(
        {
            TIED_PREFIX + n[len(TIED_PREFIX) :].partition(".")[0]
            for n in trainable
            if n.startswith(TIED_PREFIX)
        }
    )
    return [
        Finding(
            Severity.ERROR,
            "missing-layer",
            f"The layer file holding the tied module {module} is missing: its 16-bit weights are in that file "
            "alone.",
            tag_dir,
            "Copy the complete checkpoint folder; every layer with parameters writes its own file.",
        )
        for module in tied
        if module not in found.values()
    ]


def with_copy(t: TensorInfo, ref: TensorRef) -> TensorInfo:
    if ref.numel != t.numel or ref.numel == 0:
        return t
    return replace(t, module_copy=tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs()))


def plain(name: str, ref: TensorRef, kind: Kind) -> TensorInfo:
    return TensorInfo(
        name, ref.shape, ref.dtype, kind, tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())
    )


def order_key(name: str) -> tuple[int, int]:
    """Tied modules first (the pipeline module registers them first), then layers by global index (within a
    layer, the layer file's own order; the sort is stable for the rest)."""
    if m := LAYER_NAME.match(name):
        return (1, int(m.group(1)))
    return (0, 0)
