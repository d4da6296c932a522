"""Write DeepSpeed's own reconstruction of a ZeRO checkpoint to a file the test process can load safely.

Runs in a subprocess with deepspeed importable (DS_ACCELERATOR=cpu), so the test process never imports
deepspeed or unpickles DeepSpeed classes. The output is a plain `torch.save` dict (tensors, strings, lists)
that loads with `torch.load(weights_only=True)`.

    python ds_reference.py ROOT OUT.pt

Truth per tensor (``sources``):
  * ``zero_to_fp32``    -- `get_fp32_state_dict_from_zero_checkpoint(ROOT)`, the default;
  * ``module``          -- the 16-bit `module` copy, for stage-1 frozen params that zero_to_fp32 drops
                           (FORMAT.md 3.3) and for frozen params/buffers of BF16_Optimizer checkpoints;
  * ``ds_to_universal`` -- per-parameter `fp32.pt`, for BF16_Optimizer checkpoints, which zero_to_fp32
                           rejects (FORMAT.md 2.2B).
An independent rebuild that follows FORMAT.md 3.2-3.4 (with `torch.load(weights_only=False)`) is compared
with every source; the outcome is stored under ``checks`` so the tests can report where DeepSpeed and
FORMAT.md disagree without that disagreement silently changing the truth.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

OPTIM_RE = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_00_?optim_states\.pt$")
MODEL3_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_00_model_states\.pt$")


def _load(path: Path) -> Any:
    """Full unpickling is acceptable here: these are files we just produced with real DeepSpeed."""
    return torch.load(path, map_location="cpu", weights_only=False)


def _ranked(tag_dir: Path, pattern: re.Pattern[str], group: int) -> list[Path]:
    """Rank files sorted numerically, as FORMAT.md 1.2 requires."""
    found = [(int(m.group(group)), tag_dir / n) for n in os.listdir(tag_dir) if (m := pattern.match(n))]
    return [p for _, p in sorted(found)]


def _eq(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _rebuild_stage12(param_shapes: list[OrderedDict], optim: list[dict], checks: dict[str, str]) -> dict:
    """FORMAT.md 3.2: concatenate per-rank fp32 partitions, walk param_shapes with alignment padding."""
    out: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    first = optim[0]["optimizer_state_dict"]
    bf16_opt = "zero_stage" not in first
    for g, shapes in enumerate(param_shapes):
        pads = first.get("param_alignment_paddings")
        pads_g = list(pads[g]) if pads is not None else [0] * len(shapes)
        w = first["partition_count"][g]
        raw = sum(math.prod(s) + p for s, p in zip(shapes.values(), pads_g, strict=True))
        a = 2 * w
        padded = -(-raw // a) * a
        p_size = padded // w
        parts = []
        for r, f in enumerate(optim):
            osd = f["optimizer_state_dict"]
            part = osd["single_partition_of_fp32_groups"][g]
            gp = min(max((r + 1) * p_size - raw, 0), p_size)
            if osd["group_paddings"][g] != gp:
                problems.append(f"group {g} rank {r}: group_paddings {osd['group_paddings'][g]} != {gp}")
            want_len = p_size if bf16_opt else p_size - gp
            if part.numel() != want_len:
                problems.append(f"group {g} rank {r}: fp32 partition {part.numel()} != {want_len}")
            base = osd["base_optimizer_state"]["state"][g]
            if base["exp_avg"].numel() != p_size:
                problems.append(f"group {g} rank {r}: exp_avg {base['exp_avg'].numel()} != P={p_size}")
            parts.append(part.float().reshape(-1))
        flat = torch.cat(parts)
        off = 0
        for (name, shape), pad in zip(shapes.items(), pads_g, strict=True):
            n = math.prod(shape)
            out[name] = flat[off : off + n].reshape(tuple(shape)).clone()
            off += n + pad
    checks["format_layout_3_2"] = "ok" if not problems else "; ".join(problems)
    return out


def _rebuild_stage3(param_shapes: list[OrderedDict], optim: list[dict]) -> dict:
    """FORMAT.md 3.4: each parameter split into ws slices of ceil(numel/ws), concatenated per sub-group."""
    out: dict[str, torch.Tensor] = {}
    ws = len(optim)
    for g, shapes in enumerate(param_shapes):
        flats = [f["optimizer_state_dict"]["fp32_flat_groups"][g].reshape(-1) for f in optim]
        off = 0
        for name, shape in shapes.items():
            n = math.prod(shape)
            p = -(-n // ws)
            whole = torch.cat([fl[off : off + p] for fl in flats])[:n]
            out[name] = whole.reshape(tuple(shape)).clone()
            off += p
    return out


def _universal(tag_dir: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Run ds_to_universal into a scratch dir: it writes `latest_universal` into the output's parent."""
    with tempfile.TemporaryDirectory(prefix="zi_univ_") as tmp:
        out = Path(tmp) / "universal"
        cmd = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(tag_dir),
            "--output_folder",
            str(out),
            "--inject_missing_state",
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
        ]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"ds_to_universal failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result = {}
        for name in names:
            obj = _load(out / "zero" / name / "fp32.pt")
            result[name] = obj["param"] if isinstance(obj, dict) else obj
        return result


def build(root: Path) -> dict[str, Any]:
    """Collect the truth for one checkpoint root; the module docstring lists the sources."""
    tag = (root / "latest").read_text().strip()
    tag_dir = root / tag
    optim_paths = _ranked(tag_dir, OPTIM_RE, 2)
    model3 = _ranked(tag_dir, MODEL3_RE, 1)
    stage3 = bool(model3)
    ms_paths = model3 if stage3 else [tag_dir / "mp_rank_00_model_states.pt"]
    model_states = [_load(p) for p in ms_paths]
    ms = model_states[0]
    optim = [_load(p) for p in optim_paths]
    osd0 = optim[0]["optimizer_state_dict"]
    bf16_opt = "zero_stage" not in osd0
    stage = 3 if stage3 else (1 if bf16_opt else int(osd0["zero_stage"]))
    module: OrderedDict[str, torch.Tensor] = ms["module"]
    param_shapes: list[OrderedDict] = ms["param_shapes"]
    trainable = [n for shapes in param_shapes for n in shapes]
    buffers = list(ms.get("buffer_names") or [])
    aliases = dict(ms.get("shared_params") or {})
    frozen_shapes = ms.get("frozen_param_shapes") or {}
    kinds: dict[str, str] = {n: "trainable" for n in trainable}
    kinds.update({n: "buffer" for n in buffers})
    kinds.update({n: "tied" for n in aliases})
    for n in list(frozen_shapes) + list(module):
        kinds.setdefault(n, "frozen")
    compute_dtype = next(
        (t.dtype for n, t in module.items() if kinds.get(n) == "trainable" and t.numel()), None
    )
    if compute_dtype is None:  # stage 3: module params are placeholders; frozen fragments keep the dtype
        frags = ms.get("frozen_param_fragments") or {}
        compute_dtype = next(iter(frags.values())).dtype if frags else None
    if compute_dtype is None:
        compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
            "bf16"
            if ms["ds_config"].get("bf16", {}).get("enabled")
            else "fp16"
            if ms["ds_config"].get("fp16", {}).get("enabled")
            else "",
            torch.float32,
        )

    checks: dict[str, str] = {}
    if stage3:
        own = _rebuild_stage3(param_shapes, optim)
        for n in frozen_shapes:
            frag = torch.cat([m["frozen_param_fragments"][n].reshape(-1) for m in model_states])
            own[n] = frag[: math.prod(frozen_shapes[n])].reshape(tuple(frozen_shapes[n])).clone()
    else:
        own = _rebuild_stage12(param_shapes, optim, checks)
        for n, t in (ms.get("frozen_param_fragments") or {}).items():
            own[n] = t.clone()
        for n, k in kinds.items():
            if k == "frozen" and n not in own:
                own[n] = module[n].clone()
        mism = [n for n in trainable if not _eq(own[n].to(module[n].dtype), module[n])]
        checks["master_rounds_to_module"] = "ok" if not mism else "differ: " + ", ".join(mism)
    for n in buffers:
        t = module[n]
        own[n] = t.float() if t.is_floating_point() else t.clone()
    for a, o in aliases.items():
        own[a] = own[o]

    tensors: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}
    if bf16_opt:
        checks["zero_to_fp32"] = "rejects BF16_Optimizer checkpoints (expected, FORMAT.md 2.2B)"
        univ = _universal(tag_dir, trainable)
        bad = [n for n in trainable if not _eq(univ[n].float(), own[n])]
        checks["format_vs_ds_to_universal"] = "ok" if not bad else "differ: " + ", ".join(bad)
        for n in own:
            tensors[n] = univ[n].float() if n in univ else own[n]
            sources[n] = "ds_to_universal" if n in univ else "module"
        for a, o in aliases.items():
            tensors[a] = tensors[o]
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        ref = get_fp32_state_dict_from_zero_checkpoint(str(root))
        for n, t in ref.items():
            tensors[n] = t
            sources[n] = "zero_to_fp32"
        dropped = [n for n in own if n not in ref]
        for n in dropped:
            tensors[n] = own[n]
            sources[n] = "module"
        bad = [n for n in ref if not _eq(own[n], ref[n])]
        checks["format_vs_zero_to_fp32"] = "ok" if not bad else "differ: " + ", ".join(bad)
        checks["zero_to_fp32_dropped"] = ", ".join(dropped)

    return {
        "format": 1,
        "stage": stage,
        "world_size": len(optim_paths),
        "tag": tag,
        "ds_version": str(ms["ds_version"]),
        "compute_dtype": str(compute_dtype).removeprefix("torch."),
        "bf16_optimizer": bf16_opt,
        "files": sorted(os.listdir(tag_dir)),
        "tensors": {n: t.detach() for n, t in tensors.items()},  # detach keeps alias storage sharing
        "module": {n: t.detach().clone() for n, t in module.items() if t.numel() or kinds.get(n) == "buffer"},
        "kinds": kinds,
        "aliases": aliases,
        "sources": sources,
        "checks": checks,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    result = build(args.root)
    tmp = args.out.with_name(args.out.name + ".part")
    torch.save(result, tmp)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
