"""Which tensors a checkpoint holds and where their bytes are: trainable (from the layout), frozen, buffers
and tied aliases, in the module's order. Pure bookkeeping on the parsed records; problems become findings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.states import ModelStates
from inspector.scan.files import RankFiles
from inspector.scan.layout import Layout, ParamShapes
from inspector.scan.model import Kind, Segment, Severity, TensorInfo
from inspector.scan.slices import RankSlices, RankStarts


class TensorCollector:
    """Builds the tensor list; `add` records a finding (severity, code, message, file)."""

    def __init__(self, files: RankFiles, add: Callable[..., None]) -> None:
        self.files = files
        self.add = add

    def collect(
        self,
        model: ModelStates,
        models: Mapping[int, ModelStates | None],
        layout: Layout | None,
        ws: int,
        stage3: bool,
        param_shapes: ParamShapes | None,
    ) -> list[TensorInfo]:
        module = model.module
        buffer_names = list(model.buffer_names)
        buffers = set(buffer_names)  # asked once per module entry: a list made the scan quadratic
        shared = model.shared_params
        frozen_shapes = model.frozen_param_shapes
        trainable = layout.params if layout else {}
        owned = {n for group in (param_shapes or ()) for n, _ in group}
        out: dict[str, TensorInfo] = {}
        order = list(module) + [n for n in trainable if n not in module]
        for name in order:
            if name in trainable:
                out[name] = _with_module_copy(trainable[name], module.get(name))
            elif name in buffers:
                out[name] = self._plain(name, module[name], Kind.BUFFER)
            elif name in shared:
                continue  # aliases below, once owners are known
            elif name in owned:
                continue  # a trainable parameter we could not rebuild (reported already)
            else:
                t = self._frozen(name, module.get(name), models, frozen_shapes, ws, stage3)
                if t is not None:
                    out[name] = t
        for name in buffer_names:
            if name not in module:
                self.add(
                    Severity.WARNING,
                    "missing-buffer",
                    f"Buffer {name} is listed in buffer_names but not saved in the module state.",
                    None,
                )
        self._aliases(out, shared, layout is not None)
        pos = {n: i for i, n in enumerate(order)}
        return sorted(out.values(), key=lambda t: pos.get(t.name, len(pos)))

    def _aliases(self, out: dict[str, TensorInfo], shared: Mapping[str, str], say_dangling: bool) -> None:
        """Each tied parameter as an alias of its owner's bytes, once the owners are known; one whose owner
        is not in the checkpoint is left out (and said, where there is a layout to say it against)."""
        for alias, owner in shared.items():
            src = out.get(owner)
            if src is None:
                if say_dangling:
                    self.add(
                        Severity.WARNING,
                        "dangling-alias",
                        f"Tied parameter {alias} points to {owner}, "
                        "which is not in the checkpoint; left out.",
                    )
                continue
            out[alias] = TensorInfo(
                alias,
                src.shape,
                src.dtype,
                Kind.TIED,
                src.segments,
                alias_of=owner,
                group=src.group,
                moments=src.moments,
                module_copy=src.module_copy,
            )

    def _plain(self, name: str, ref: TensorRef, kind: Kind) -> TensorInfo:
        segs = tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())
        return TensorInfo(name, ref.shape, ref.dtype, kind, segs)

    def _frozen(
        self,
        name: str,
        ref: TensorRef | None,
        models: Mapping[int, ModelStates | None],
        frozen_shapes: Mapping[str, tuple[int, ...]] | None,
        ws: int,
        stage3: bool,
    ) -> TensorInfo | None:
        """Frozen params: full 16-bit tensor (stage 1 `module`, stage 2 fragments) or per-rank slices (stage 3)."""
        shape = (
            tuple(frozen_shapes[name])
            if frozen_shapes and name in frozen_shapes
            else (ref.shape if isinstance(ref, TensorRef) else None)
        )
        if shape is None:
            return None
        numel = 1
        for d in shape:
            numel *= d
        if not stage3:
            frag = (models[0].frozen_param_fragments or {}).get(name, ref) if models[0] else ref
            if not isinstance(frag, TensorRef) or frag.numel != numel:
                self.add(Severity.ERROR, "missing-frozen", f"Frozen parameter {name} has no saved data.")
                return None
            t = self._plain(name, frag, Kind.FROZEN)
            return TensorInfo(name, shape, t.dtype, Kind.FROZEN, t.segments)
        part = -(-numel // ws) if ws else 0
        held: list[TensorRef] = []  # the fragments that hold elements: ranks 0 .. ceil(numel/part) - 1
        dtype = ref.dtype if isinstance(ref, TensorRef) else "bfloat16"
        for r in range(ws):
            m = models.get(r)
            frag = (m.frozen_param_fragments or {}).get(name) if m is not None else None
            take = max(0, min(part, numel - r * part))
            if not isinstance(frag, TensorRef) or frag.numel < take or not frag.is_contiguous():
                self.add(
                    Severity.ERROR,
                    "missing-frozen",
                    f"Rank {r} lacks its slice of frozen parameter {name}.",
                    self.files.zero3_model.get(r),
                )
                return None
            dtype = frag.dtype
            if take:
                held.append(frag)
        segs: Any = _rank_slices(held, numel, part)  # a `Sequence[Segment]`, as layout.py keeps trainable ones
        return TensorInfo(name, shape, dtype, Kind.FROZEN, segs)


def _rank_slices(held: list[TensorRef], numel: int, part: int) -> Sequence[Segment]:
    """A stage-3 frozen parameter's slices, rank r's `part` elements (fewer on the last) at the start of its
    fragment: one `RankSlices` over the ranks' (file, offset) table, as the trainable ones are kept (a tuple
    of `Segment`s was ~100 bytes a rank); fragments of mixed dtypes stay a tuple."""
    if len({f.dtype for f in held}) > 1:
        return tuple(Segment(f.path, f.offset, min(part, numel - r * part), f.dtype) for r, f in enumerate(held))
    if not held:
        return ()
    return RankSlices(RankStarts([f.path for f in held], [f.offset for f in held], held[0].dtype), 0, numel, part)


def _with_module_copy(t: TensorInfo, ref: TensorRef | None) -> TensorInfo:
    """Attach the 16-bit module copy of a trainable param (stage 1/2; stage 3 keeps empty placeholders)."""
    if not isinstance(ref, TensorRef) or ref.numel != t.numel or ref.numel == 0:
        return t
    segs = tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())
    return replace(t, module_copy=segs)
