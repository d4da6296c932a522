"""The files of one demo tag in DeepSpeed's exact layout: the model-states file and each rank's optimizer
file, for stages 1 and 2 (flat partitions per parameter group) and stage 3 (sub-groups). `writer` decides
where they go and takes them back if a run fails."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from inspector.convert.root import OutputRoot
from inspector.demo.spec import DS_VERSION, HALF, DemoSpec, Param
from inspector.demo.values import Array, FlatGroup, buffer_values
from inspector.format import ptwriter as pw


def _shifted(prod: Callable[[int, int], Array], base: int) -> Callable[[int, int], Array]:
    return lambda s, c: prod(base + s, c)


def _adam_group(lr: float, wd: float, params: list[int]) -> dict[str, Any]:
    return {
        "weight_decay": wd,
        "lr": lr,
        "betas": (0.9, 0.999),
        "eps": 1e-08,
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": False,
        "params": params,
    }


def _loss_scaler(spec: DemoSpec) -> pw.Obj:
    if spec.dtype == "fp16":
        return pw.Obj(
            pw.Global("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
            {
                "cur_scale": 256.0,
                "dynamic": True,
                "cur_iter": spec.steps,
                "last_overflow_iter": -1,
                "scale_factor": 2.0,
                "scale_window": 1000,
                "min_scale": 1.0,
                "delayed_shift": 1,
                "cur_hysteresis": 1,
                "consecutive_hysteresis": False,
                "raise_error_at_min_scale": True,
                "dtype": pw.Global("torch", "float16"),
            },
        )
    return pw.Obj(
        pw.Global("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), {"cur_scale": 1.0, "dynamic": False}
    )


def _step(spec: DemoSpec) -> pw.Tensor:
    value = float(spec.steps)
    return pw.Tensor(pw.Storage("float32", 1, lambda s, c: np.full(c, value, np.float32)), ())


class Saver:
    """Writes one `.pt` file of the tag folder through the output root."""

    def __init__(self, root: OutputRoot, tag: str) -> None:
        self.root, self.tag = root, tag

    def __call__(self, obj: Any, name: str) -> None:
        archive = os.path.splitext(name)[0]
        self.root.write_with(f"{self.tag}/{name}", lambda fh: pw.dump(obj, fh, archive))


class _Writer:
    def __init__(
        self, spec: DemoSpec, params: list[Param], tied: dict[str, str], groups: list[list[Param]]
    ) -> None:
        self.spec = spec
        self.params = params
        self.tied = tied
        self.groups = groups
        self.ws = spec.world_size
        self.half = HALF[spec.dtype]
        self.prefix = "bf16_" if spec.dtype == "bf16" else ""

    def _module_states(
        self,
        module: OrderedDict[str, Any],
        param_shapes: list[Any],
        frozen_shapes: Any,
        frozen_frags: Any,
        shared: dict[str, str],
        common: dict[str, Any],
    ) -> dict[str, Any]:
        s = self.spec
        return {
            "module": module,
            "buffer_names": [p.name for p in self.params if p.kind == "buffer"],
            "optimizer": None,
            "param_shapes": param_shapes,
            "frozen_param_shapes": frozen_shapes,
            "shared_params": shared,
            "frozen_param_fragments": frozen_frags,
            "lr_scheduler": None,
            "data_sampler": None,
            "random_ltd": None,
            "skipped_steps": 0,
            "global_steps": s.steps,
            "global_samples": s.steps * 4 * self.ws,
            "dp_world_size": self.ws,
            "mp_world_size": 1,
            "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
            **common,
        }

    def _buffer(self, p: Param) -> pw.Tensor:
        return pw.Tensor(
            pw.Storage(p.dtype, p.numel, lambda s, c: buffer_values(p).reshape(-1)[s : s + c]), p.shape
        )

    def _param_shapes(self, groups: list[list[Param]]) -> list[OrderedDict[str, Any]]:
        return [OrderedDict((p.name, pw.size(p.shape)) for p in g) for g in groups]

    def write(self, save: Saver, common: dict[str, Any], progress: Callable[[str], None]) -> None:
        raise NotImplementedError


class Stage12Writer(_Writer):
    def write(self, save: Saver, common: dict[str, Any], progress: Callable[[str], None]) -> None:
        s, ws = self.spec, self.ws
        layouts = []
        for g in self.groups:
            entries, off = [], 0
            for p in g:
                entries.append((p.name, off, 0, p.numel))
                off += p.numel
            align = 2 * ws
            part = -(-off // align) * align // ws
            layouts.append((entries, off, part))
        # model states: trainable params are views into one 16-bit flat storage per group
        flat16 = [
            pw.Storage(self.half, part * ws, FlatGroup(entries, "half", self.half))
            for entries, _, part in layouts
        ]
        views: dict[str, pw.Tensor] = {}
        for gi, (entries, _, _) in enumerate(layouts):
            for (name, off, _, _), p in zip(entries, self.groups[gi], strict=True):
                views[name] = pw.Tensor(flat16[gi], p.shape, off)
        module: OrderedDict[str, Any] = OrderedDict()
        frozen: OrderedDict[str, Any] = OrderedDict()
        for p in self.params:
            if p.kind == "buffer":
                module[p.name] = self._buffer(p)
            elif p.kind == "frozen":
                t = pw.Tensor(
                    pw.Storage(self.half, p.numel, FlatGroup([(p.name, 0, 0, p.numel)], "frozen", self.half)),
                    p.shape,
                )
                module[p.name] = frozen[p.name] = t
            else:
                module[p.name] = views[self.tied.get(p.name, p.name)]
        stage2 = s.stage == 2
        frozen_shapes = OrderedDict((n, pw.size(t.shape)) for n, t in frozen.items()) if stage2 else None
        progress("mp_rank_00_model_states.pt")
        save(
            self._module_states(
                module,
                self._param_shapes(self.groups),
                frozen_shapes,
                frozen if stage2 else None,
                dict(self.tied),
                common,
            ),
            "mp_rank_00_model_states.pt",
        )
        for r in range(ws):
            name = f"{self.prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            progress(name)
            save({"optimizer_state_dict": self._optim(r, layouts), **common}, name)

    def _optim(
        self, r: int, layouts: list[tuple[list[tuple[str, int, int, int]], int, int]]
    ) -> dict[str, Any]:
        s = self.spec
        state, fp32, paddings, mappings = {}, [], [], []
        for gi, (entries, raw, part) in enumerate(layouts):
            lo = r * part
            keep = part if s.bf16_optimizer else min(part, max(0, raw - lo))
            paddings.append(min(part, max(0, (r + 1) * part - raw)))
            moments = {
                m: pw.Tensor(
                    pw.Storage("float32", part, _shifted(FlatGroup(entries, m, self.half), lo)), (part,)
                )
                for m in ("exp_avg", "exp_avg_sq")
            }
            state[gi] = {"step": _step(s), **moments}
            fp32.append(
                pw.Tensor(
                    pw.Storage("float32", keep, _shifted(FlatGroup(entries, "master", self.half), lo)),
                    (keep,),
                )
            )
            mapping: OrderedDict[str, Any] = OrderedDict()
            for name, off, _, n in entries:
                a, b = max(off, lo), min(off + n, lo + part)
                if a < b:
                    mapping[name] = pw.Obj(
                        pw.Global("deepspeed.utils.tensor_fragment", "fragment_address"),
                        {"numel": b - a, "start": a - lo},
                    )
            mappings.append(mapping)
        pgs = [_adam_group(0.0001, 0.01 if gi == 0 else 0.0, [gi]) for gi in range(len(layouts))]
        base = {"state": state, "param_groups": pgs}
        counts = [self.ws] * len(layouts)
        if s.bf16_optimizer:
            return {
                "clip_grad": 1.0,
                "base_optimizer_state": base,
                "single_partition_of_fp32_groups": fp32,
                "group_paddings": paddings,
                "partition_count": counts,
                "ds_version": DS_VERSION,
                "param_slice_mappings": mappings,
            }
        return {
            "loss_scaler": _loss_scaler(s),
            "dynamic_loss_scale": s.dtype == "fp16",
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": base,
            "single_partition_of_fp32_groups": fp32,
            "zero_stage": pw.Reduce(pw.Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), (s.stage,)),
            "group_paddings": paddings,
            "param_alignment_paddings": [[0] * len(e) for e, _, _ in layouts],
            "partition_count": counts,
            "ds_version": DS_VERSION,
            "param_slice_mappings": mappings,
        }


class Stage3Writer(_Writer):
    def _sub_groups(self) -> list[tuple[int, list[Param]]]:
        """DeepSpeed's _create_fp16_sub_groups: cut each group once partition numel reaches the size."""
        out = []
        for gi, g in enumerate(self.groups):
            total = sum(-(-p.numel // self.ws) for p in g)
            if total <= self.spec.sub_group_size:
                out.append((gi, g))
                continue
            cur: list[Param] = []
            acc = 0
            for p in g:
                cur.append(p)
                acc += -(-p.numel // self.ws)
                if acc >= self.spec.sub_group_size or p is g[-1]:
                    out.append((gi, cur))
                    cur, acc = [], 0
        return out

    def write(self, save: Saver, common: dict[str, Any], progress: Callable[[str], None]) -> None:
        _s, ws = self.spec, self.ws
        subs = self._sub_groups()
        param_shapes = self._param_shapes([g for _, g in subs])
        frozen = [p for p in self.params if p.kind == "frozen"]
        for r in range(ws):
            module: OrderedDict[str, Any] = OrderedDict()
            for p in self.params:
                module[p.name] = (
                    self._buffer(p) if p.kind == "buffer" else pw.Tensor(pw.Storage(self.half, 0), (0,))
                )
            frags: OrderedDict[str, Any] = OrderedDict()
            for p in frozen:
                part = -(-p.numel // ws)
                entries = [(p.name, 0, r * part, max(0, min(part, p.numel - r * part)))]
                frags[p.name] = pw.Tensor(
                    pw.Storage(self.half, part, FlatGroup(entries, "frozen", self.half)), (part,)
                )
            shapes = OrderedDict((p.name, pw.size(p.shape)) for p in frozen)
            name = f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
            progress(name)
            save(
                self._module_states(
                    module, param_shapes, shapes, frags, dict(self.tied) if r == 0 else {}, common
                ),
                name,
            )
            name = f"{self.prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            progress(name)
            save({"optimizer_state_dict": self._optim(r, subs), **common}, name)

    def _optim(self, r: int, subs: list[tuple[int, list[Param]]]) -> dict[str, Any]:
        s, ws = self.spec, self.ws
        state, flats = {}, []
        for si, (_, g) in enumerate(subs):
            entries, off = [], 0
            for p in g:
                part = -(-p.numel // ws)
                entries.append((p.name, off, r * part, max(0, min(part, p.numel - r * part))))
                off += part
            state[si] = {
                "step": _step(s),
                **{
                    m: pw.Tensor(pw.Storage("float32", off, FlatGroup(entries, m, self.half)), (off,))
                    for m in ("exp_avg", "exp_avg_sq")
                },
            }
            flats.append(
                pw.Tensor(pw.Storage("float32", off, FlatGroup(entries, "master", self.half)), (off,))
            )
        pgs = [
            _adam_group(0.0001, 0.01 if gi == 0 else 0.0, [si for si, (g, _) in enumerate(subs) if g == gi])
            for gi in range(len(self.groups))
        ]
        return {
            "zero_stage": pw.Reduce(pw.Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), (3,)),
            "loss_scaler": _loss_scaler(s),
            "dynamic_loss_scale": s.dtype == "fp16",
            "overflow": False,
            "partition_count": ws,
            "optimizer_state_dict": {"state": state, "param_groups": pgs},
            "fp32_flat_groups": flats,
        }
