"""Write a realistic DeepSpeed ZeRO checkpoint in the exact on-disk layout, at any size, in flat memory.

A small LLaMA-shaped model (tied embeddings, a frozen position table, fp32 and int64 buffers, a decay and a
no-decay param group, odd sizes that need padding) is laid out as DeepSpeed 0.19.8 would save it after a few
steps: model states, per-rank optimizer files with fp32 masters and Adam moments, 16-bit module copies.
Values come from a counter-based hash, so any slice can be produced on demand and `expected()` can say what
any tensor holds; storages are streamed, so a 1B-parameter demo needs no more RAM than a 1M one.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inspector.format import ptwriter as pw

DS_VERSION = "0.19.8"
_HALF = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class DemoSpec:
    """What to write. `params` is a target; the real count is within a few percent."""

    stage: int = 2
    world_size: int = 2
    dtype: str = "bf16"
    params: int = 2_000_000
    frozen: bool = True
    tied: bool = True
    bf16_optimizer: bool = False
    sub_group_size: int = 1_000_000_000
    steps: int = 3
    tag: str | None = None


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    kind: str  # "trainable" | "frozen" | "buffer"
    dtype: str = "float32"  # buffers only
    decay: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def architecture(spec: DemoSpec) -> tuple[list[Param], dict[str, str]]:
    """Module-order parameters and buffers, and the tied aliases {alias: owner}."""
    n = spec.params
    layers = 2 if n < 2_000_000 else 4 if n < 100_000_000 else 8 if n < 2_000_000_000 else 16
    vocab = min(50_257, 1_001 + (n // 20_000) * 2)
    max_pos = 129 if spec.frozen else 0
    # 4h^2 (attention) + 3*h*ffn (mlp, ffn ~ 8h/3) per layer, plus embeddings
    a, b = 12.0 * layers, float(vocab + max_pos)
    hidden = max(8, int((-b + math.sqrt(b * b + 4 * a * n)) / (2 * a)))
    hidden += 1 - hidden % 2  # odd, so flat groups need padding
    ffn = hidden * 8 // 3 + 1
    ps = [Param("model.embed_tokens.weight", (vocab, hidden), "trainable")]
    if spec.frozen:
        ps.append(Param("model.embed_positions.weight", (max_pos, hidden), "frozen"))
    for i in range(layers):
        p = f"model.layers.{i}."
        ps += [Param(p + f"self_attn.{x}_proj.weight", (hidden, hidden), "trainable") for x in "qkvo"]
        ps.append(Param(p + "self_attn.o_proj.bias", (hidden,), "trainable", decay=False))
        ps += [
            Param(p + "mlp.gate_proj.weight", (ffn, hidden), "trainable"),
            Param(p + "mlp.up_proj.weight", (ffn, hidden), "trainable"),
            Param(p + "mlp.down_proj.weight", (hidden, ffn), "trainable"),
            Param(p + "input_layernorm.weight", (hidden,), "trainable", decay=False),
            Param(p + "post_attention_layernorm.weight", (hidden,), "trainable", decay=False),
        ]
    ps += [
        Param("model.norm.weight", (hidden,), "trainable", decay=False),
        Param("model.rotary_emb.inv_freq", (max(1, hidden // 16),), "buffer", "float32"),
        Param("model.tokens_seen", (), "buffer", "int64"),
    ]
    tied: dict[str, str] = {}
    if spec.tied:
        ps.append(Param("lm_head.weight", (vocab, hidden), "trainable"))
        tied["lm_head.weight"] = "model.embed_tokens.weight"
    return ps, tied


# --- values --------------------------------------------------------------------------------------------------


_BLOCK = 1 << 12


def _uniform(seed: int, start: int, count: int) -> torch.Tensor:
    """Uniform [0, 1) float32 for elements [start, start+count) of a stream: blocks of 4 Ki elements are
    seeded by (seed, block), so any slice can be produced without generating what comes before it."""
    if count <= 0:
        return torch.empty(0)
    k0, k1 = start // _BLOCK, (start + count - 1) // _BLOCK
    g = torch.Generator()
    out = torch.empty((k1 - k0 + 1) * _BLOCK)
    for i, k in enumerate(range(k0, k1 + 1)):
        g.manual_seed(seed * 1_000_003 + k)
        torch.rand(_BLOCK, generator=g, out=out[i * _BLOCK : (i + 1) * _BLOCK])
    off = start - k0 * _BLOCK
    return out[off : off + count]


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def master_values(name: str, start: int, count: int) -> torch.Tensor:
    """fp32 master weights of elements [start, start+count) of a parameter, flattened."""
    u = _uniform(_seed(name), start, count)
    if name.endswith("norm.weight"):
        return u.sub_(0.5).mul_(0.1).add_(1.0)
    return u.sub_(0.5).mul_(0.08)


def state_values(name: str, start: int, count: int, state: str, half: str) -> torch.Tensor:
    """The value of a state ("master", "exp_avg", "exp_avg_sq", "half", "frozen") for a slice."""
    m = master_values(name, start, count)
    if state == "master":
        return m
    if state == "exp_avg":
        return m * 0.1
    if state == "exp_avg_sq":
        return m * m * 0.01
    return m.to(getattr(torch, half))  # "half" / "frozen": the 16-bit copy


def buffer_values(p: Param) -> torch.Tensor:
    if p.dtype == "int64":
        return torch.full(p.shape, 12_345, dtype=torch.int64)
    n = p.numel
    return (
        (1.0 / (10_000 ** (torch.arange(n, dtype=torch.float64) / max(n, 1)))).to(torch.float32).view(p.shape)
    )


def expected(spec: DemoSpec, name: str) -> torch.Tensor:
    """What `get_fp32_state_dict_from_zero_checkpoint` should return for `name` (frozen stay 16-bit)."""
    params, tied = architecture(spec)
    name = tied.get(name, name)
    p = next(q for q in params if q.name == name)
    if p.kind == "buffer":
        return buffer_values(p)
    if p.kind == "frozen":
        return state_values(name, 0, p.numel, "frozen", _HALF[spec.dtype]).view(p.shape)
    return master_values(name, 0, p.numel).view(p.shape)


# --- flat buffers ---------------------------------------------------------------------------------------------


class FlatGroup:
    """Producer of any slice of a group's flat buffer (params back to back, zeros in padding)."""

    def __init__(self, entries: list[tuple[str, int, int, int]], state: str, half: str) -> None:
        # entries: (name, flat offset, param start element, count) sorted by flat offset
        self.entries = entries
        self.starts = [e[1] for e in entries]
        self.state = state
        self.half = half

    def __call__(self, start: int, count: int) -> torch.Tensor:
        dtype = getattr(torch, self.half) if self.state in ("half", "frozen") else torch.float32
        out = torch.zeros(count, dtype=dtype)
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        end = start + count
        while i < len(self.entries):
            name, foff, pstart, n = self.entries[i]
            if foff >= end:
                break
            lo, hi = max(start, foff), min(end, foff + n)
            if lo < hi:
                out[lo - start : hi - start] = state_values(
                    name, pstart + lo - foff, hi - lo, self.state, self.half
                )
            i += 1
        return out


def _shifted(prod: Callable[[int, int], torch.Tensor], base: int) -> Callable[[int, int], torch.Tensor]:
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


def ds_config(spec: DemoSpec) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.0001, "torch_adam": True}},
        "zero_optimization": {"stage": spec.stage},
    }
    if spec.stage == 3 and spec.sub_group_size != 1_000_000_000:
        cfg["zero_optimization"]["sub_group_size"] = spec.sub_group_size
    if spec.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif spec.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    if spec.bf16_optimizer:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def _step(spec: DemoSpec) -> pw.Tensor:
    value = float(spec.steps)
    return pw.Tensor(pw.Storage("float32", 1, lambda s, c: torch.full((c,), value)), ())


def write_demo(out_dir: str, spec: DemoSpec, progress: Callable[[str], None] | None = None) -> str:
    """Write the checkpoint under `out_dir` (root with `latest`); returns the tag folder."""
    if spec.stage not in (1, 2, 3):
        raise ValueError("stage must be 1, 2 or 3")
    if spec.bf16_optimizer and (spec.stage != 1 or spec.dtype != "bf16"):
        raise ValueError("BF16_Optimizer exists only for stage 1 with bf16")
    tag = spec.tag or f"global_step{spec.steps}"
    tag_dir = os.path.join(out_dir, tag)
    os.makedirs(tag_dir, exist_ok=True)
    params, tied = architecture(spec)
    groups = [
        [p for p in params if p.kind == "trainable" and p.name not in tied and p.decay],
        [p for p in params if p.kind == "trainable" and p.name not in tied and not p.decay],
    ]
    common = {"ds_config": ds_config(spec), "ds_version": DS_VERSION}
    writer = (
        _Stage3Writer(spec, params, tied, groups)
        if spec.stage == 3
        else _Stage12Writer(spec, params, tied, groups)
    )
    writer.write(tag_dir, common, progress or (lambda _m: None))
    with open(os.path.join(out_dir, "latest"), "w") as fh:
        fh.write(tag)
    with open(os.path.join(out_dir, "demo_spec.json"), "w") as fh:
        json.dump(spec.__dict__, fh, indent=1)
    return tag_dir


class _Writer:
    def __init__(
        self, spec: DemoSpec, params: list[Param], tied: dict[str, str], groups: list[list[Param]]
    ) -> None:
        self.spec = spec
        self.params = params
        self.tied = tied
        self.groups = groups
        self.ws = spec.world_size
        self.half = _HALF[spec.dtype]
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

    def write(self, tag_dir: str, common: dict[str, Any], progress: Callable[[str], None]) -> None:
        raise NotImplementedError


class _Stage12Writer(_Writer):
    def write(self, tag_dir: str, common: dict[str, Any], progress: Callable[[str], None]) -> None:
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
        pw.save(
            self._module_states(
                module,
                self._param_shapes(self.groups),
                frozen_shapes,
                frozen if stage2 else None,
                dict(self.tied),
                common,
            ),
            os.path.join(tag_dir, "mp_rank_00_model_states.pt"),
        )
        for r in range(ws):
            name = f"{self.prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            progress(name)
            pw.save({"optimizer_state_dict": self._optim(r, layouts), **common}, os.path.join(tag_dir, name))

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


class _Stage3Writer(_Writer):
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

    def write(self, tag_dir: str, common: dict[str, Any], progress: Callable[[str], None]) -> None:
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
            pw.save(
                self._module_states(
                    module, param_shapes, shapes, frags, dict(self.tied) if r == 0 else {}, common
                ),
                os.path.join(tag_dir, name),
            )
            name = f"{self.prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            progress(name)
            pw.save({"optimizer_state_dict": self._optim(r, subs), **common}, os.path.join(tag_dir, name))

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
