"""Universal checkpoint benchmark: `convert --format universal` against DeepSpeed's `ds_to_universal`.

    python tests/benchmarks/bench_universal.py CKPT_ROOT [--work DIR] [--skip-deepspeed]

Runs both tools on the same checkpoint in the same session (ours first, then DeepSpeed's with
`--inject_missing_state`), each as a child process measured by bench_convert's Runner (wall time of the
whole process, peak RSS of its process tree sampled, ru_maxrss), deletes each output after measuring its
size, and prints a Markdown table. CKPT_ROOT is a folder with `latest`, e.g. from
`python -m inspector demo DIR --stage 3 --params 500M`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from bench_convert import Runner  # noqa: E402  (the child-process sampler shared with the safetensors benchmark)

REPO = Path(__file__).resolve().parents[2]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--work", default=None, help="where outputs go (default: a temp dir beside root)")
    ap.add_argument("--skip-deepspeed", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    root = Path(args.root).resolve()
    tag = (root / "latest").read_text().strip()
    work = Path(args.work or tempfile.mkdtemp(prefix="zi-uni-bench-", dir=root.parent)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), DS_ACCELERATOR="cpu")
    runner = Runner(work, env, args.timeout)
    rows = []
    ours_out = work / "ours"
    r = runner.run(
        "zero-inspector",
        [sys.executable, "-m", "inspector", "convert", str(root), str(ours_out), "--format", "universal"],
    )
    rows.append(("zero-inspector `convert --format universal`", r, _size(ours_out) if r.ok else 0))
    if not r.ok:
        print(r.failure(), file=sys.stderr)
    shutil.rmtree(ours_out, ignore_errors=True)
    if not args.skip_deepspeed:
        ds_out = work / "ds"
        argv = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(root / tag),
        ]
        argv += ["--output_folder", str(ds_out / f"{tag}_uni"), "--inject_missing_state"]
        ds_out.mkdir()
        r = runner.run("ds_to_universal", argv)
        rows.append(("DeepSpeed `ds_to_universal --inject_missing_state`", r, _size(ds_out) if r.ok else 0))
        if not r.ok:
            print(r.failure(), file=sys.stderr)
        shutil.rmtree(ds_out, ignore_errors=True)
    print(f"checkpoint: {root} ({_size(root / tag) / 2**30:.2f} GiB in {tag})\n")
    print("| tool | wall s | peak RSS (tree) MiB | ru_maxrss MiB | output GB | other load (cores) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, run, size in rows:
        print(
            f"| {label} | {run.wall:.1f} | {run.peak_tree / 2**20:,.0f} | {run.ru_maxrss / 2**20:,.0f} | "
            f"{size / 1e9:.2f} | {run.other_load:.2f} |"
        )
    if len(rows) == 2 and rows[1][1].ok:
        print(f"\nwall ratio ours/DeepSpeed: {rows[0][1].wall / rows[1][1].wall:.2f}")


if __name__ == "__main__":
    main()
