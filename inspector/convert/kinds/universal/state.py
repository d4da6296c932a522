"""The small files of a universal checkpoint: `zero/optimizer_state.pt` and the stage-1/2 `step.pt` files,
rebuilt from rank 0's optimizer state as our restricted unpickler read it (tensors stream from the source
file; DeepSpeed's records pickle as the classes they stand for, so DeepSpeed's loader gets its own objects).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector.errors import DamagedCheckpointError, UnsupportedCheckpointError
from inspector.format.dtypes import DTYPES, itemsize, numpy_dtype
from inspector.format.records import InertDict, Record, ZeroStage, _OrderedDict, _Token
from inspector.format.torchzip import TensorRef, load_tree
from inspector.remote.roots import open_file

if TYPE_CHECKING:
    from inspector.convert.kinds.universal.plan import UniversalPlan
    from inspector.convert.root import OutputRoot

# what the stage-1/2 optimizer_state.pt leaves out (ds_to_universal does the same): sharded state
_SHARDED = ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")


def write_small(
    plan: UniversalPlan, root: OutputRoot, staging: str, fsync: bool = False
) -> tuple[tuple[str, int], ...]:
    """`zero/optimizer_state.pt` and the stage-1/2 `step.pt` files, from rank 0's optimizer state, into the
    folder `staging`; returns each one's name in the output folder and size."""
    from inspector.format import ptwriter as pw

    tree = load_tree(plan.optim_file, plan.sources[0] if plan.sources else None)
    osd = tree.get("optimizer_state_dict") if isinstance(tree, dict) else None
    if not isinstance(osd, dict):
        raise DamagedCheckpointError(f"{plan.optim_file} has no optimizer_state_dict.")
    if plan.stage >= 3:
        inner = dict(osd.get("optimizer_state_dict") or {})
        state = inner.get("state") or {}
        # the step per sub-group; the flat moments are per parameter in zero/ (DeepSpeed copies them here
        # whole, which is most of its extra output)
        inner["state"] = {
            k: {"step": v["step"]} for k, v in state.items() if isinstance(v, dict) and "step" in v
        }
        out = {k: v for k, v in osd.items() if k not in ("optimizer_state_dict", "fp32_flat_groups")}
        out["optimizer_state_dict"] = inner
        out["param_groups"] = inner.get("param_groups", [])
    else:
        base = osd.get("base_optimizer_state") or {}
        out = {k: v for k, v in osd.items() if k not in _SHARDED}
        out["param_groups"] = base.get("param_groups", [])
    # small: written again on every run, so a resumed export never trusts one a kill may have damaged
    obj = to_pickle(out, pw)
    rel = "zero/optimizer_state.pt"
    size = root.write_with(f"{staging}/{rel}", lambda fh: pw.dump(obj, fh, "optimizer_state"), fsync=fsync)
    written = [(f"{plan.folder}/{rel}", size)]
    steps = _steps(plan, osd)
    for name, _ in plan.step_params:
        step = steps.get(name)
        if step is None:
            continue
        rel = f"zero/{name}/step.pt"
        size = root.write_with(
            f"{staging}/{rel}", partial(pw.dump, to_pickle(step, pw), archive="step"), fsync=fsync
        )
        written.append((f"{plan.folder}/{rel}", size))
    return tuple(written)


def _steps(plan: UniversalPlan, osd: dict[str, Any]) -> dict[str, Any]:
    """Each stage-1/2 parameter's optimizer step, from the group that holds it: the group of the file holding
    the parameter (a later pipeline stage's, an expert-parallel rank's) whose `param_slice_mappings` names
    it, else rank 0's group `g` (the scan's group numbers are rank 0's own for a data-parallel run)."""
    base = osd.get("base_optimizer_state") or {}
    groups, state = base.get("param_groups") or [], base.get("state") or {}
    out: dict[str, Any] = {}
    named: dict[str, dict[str, Any]] = {}
    files = plan.step_files or (plan.optim_file,) * len(plan.step_params)
    for (name, g), file in zip(plan.step_params, files, strict=True):
        file = file or plan.optim_file
        if file not in named:
            named[file] = _named_steps(file, plan)
        if name in named[file]:
            out[name] = named[file][name]
            continue
        key = groups[g]["params"][0] if g < len(groups) and groups[g].get("params") else g
        out[name] = (state.get(key) or {}).get("step")
    return out


def _named_steps(file: str, plan: UniversalPlan) -> dict[str, Any]:
    """Parameter name -> the step of its group in one stage-1/2 optimizer file (names from its
    `param_slice_mappings`, through the typed parser)."""
    from inspector.parse.states import OptimStates

    parsed = OptimStates.parse(load_tree(file, _source(plan, file)), file, stage3=False)
    return {name: g.step for g in parsed.groups for name, _, _ in g.slices or () if g.step is not None}


def _source(plan: UniversalPlan, path: str) -> Any:
    return next((s for s in plan.sources if s.contains(path)), plan.sources[0] if plan.sources else None)


def to_pickle(obj: Any, pw: Any) -> Any:
    """Turn a tree read by our restricted unpickler back into ptwriter objects that pickle as the original:
    tensors stream their bytes from the source file, DeepSpeed records become NEWOBJ+BUILD again."""
    if isinstance(obj, TensorRef):
        runs = list(obj.runs())
        storage = pw.Storage(obj.dtype, obj.numel, _ref_producer(obj.path, runs, obj.dtype))
        return pw.Tensor(storage, obj.shape)
    if isinstance(obj, ZeroStage):
        return pw.Reduce(pw.Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), (int(obj),))
    if isinstance(obj, _Token):
        return pw.Global("torch", obj.name)
    if isinstance(obj, Record):
        module, _, name = obj._qualname.rpartition(".")
        state = {k: to_pickle(v, pw) for k, v in obj.__dict__.items() if not k.startswith("_")}
        return pw.Obj(pw.Global(module, name), state)
    if isinstance(obj, _OrderedDict | OrderedDict):
        return OrderedDict((to_pickle(k, pw), to_pickle(v, pw)) for k, v in obj.items())
    if isinstance(obj, InertDict | dict):
        return {to_pickle(k, pw): to_pickle(v, pw) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_pickle(v, pw) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_pickle(v, pw) for v in obj)
    return obj


def _ref_producer(path: str, runs: list[tuple[int, int]], dtype: str) -> Callable[[int, int], Any]:
    """Small tensors (steps, scalars): the element range read from its runs with pread, as numpy."""
    if dtype not in DTYPES:
        raise UnsupportedCheckpointError(f"{path}: a {dtype} tensor in the optimizer state is not supported.")
    size = itemsize(dtype)

    def produce(start: int, count: int) -> Any:
        out = bytearray()
        pos = 0
        handle = open_file(path)  # as scan opens it: never a FIFO swapped in since
        try:
            for off, n in runs:
                lo, hi = max(start, pos), min(start + count, pos + n)
                if lo < hi:
                    out += handle.pread((hi - lo) * size, off + (lo - pos) * size)
                pos += n
        finally:
            handle.close()
        return np.frombuffer(bytes(out), dtype=numpy_dtype(dtype))

    return produce
