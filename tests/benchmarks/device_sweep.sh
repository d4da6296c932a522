#!/bin/sh
# Issue 30 on a many-core machine, in one call: a demo, then the worker sweep at 1-16 workers with the time
# model's inputs recorded (--rows-json) for tests/benchmarks/fit_preflight.py. Needs only python3 with numpy,
# ml_dtypes, safetensors, rich, humanize and psutil (no install, no network, no git: the tree may be a copy).
#
#     ZI_COMMIT=$(git rev-parse --short HEAD)   # here, to name the commit in the rows
#     OUT=/some/dir PARAMS=500M sh tests/benchmarks/device_sweep.sh
#
# Sized for one 10-minute call on a 16-core machine (estimated from the 2-core sweeps, not yet run on one):
# the demo (500M: ~30 s; 1B: ~61 s), health and bf16 at 1, 2, 4, 8 and 16 workers warm and cold, then fp32
# and universal at 1 and 16 workers warm. Each part writes its rows and its results.md section into $OUT as
# it ends, so a call stopped at its limit still brings back what finished. Append the sections to
# tests/benchmarks/results.md by hand, saying which machine gave them. machine.txt records the kernel: a
# sandboxed one (gVisor reports 4.4.0) may not honour POSIX_FADV_DONTNEED, and then the "cold" rows read warm
# pages; compare their floors with the warm rows' before quoting them as cold.
set -eu
OUT=${OUT:-/tmp/zi-device-out}
WORK=${WORK:-/tmp/zi-device}
PARAMS=${PARAMS:-500M}
STAGE=${STAGE:-2}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
{ nproc; uname -a; "$PY" --version; } > "$OUT/machine.txt" 2>&1
ROOT="$WORK/demo-$PARAMS-s$STAGE"
[ -f "$ROOT/latest" ] || "$PY" -m inspector demo "$ROOT" --params "$PARAMS" --stage "$STAGE" --overwrite
"$PY" tests/benchmarks/sweep.py --root "$ROOT" --workdir "$WORK" --workers 1 2 4 8 16 \
    --commands health bf16 --rows-json "$OUT/rows-cores.json" > "$OUT/sweep-cores.md" 2>&1 || true
"$PY" tests/benchmarks/sweep.py --root "$ROOT" --workdir "$WORK" --workers 1 16 --cache warm \
    --commands fp32 universal --rows-json "$OUT/rows-writes.json" > "$OUT/sweep-writes.md" 2>&1 || true
tail -n 25 "$OUT/sweep-cores.md" "$OUT/sweep-writes.md"
