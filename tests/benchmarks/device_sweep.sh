#!/bin/sh
# Issue 43's checks on a many-core machine, in one call: health against its read floor, convert --dtype bf16
# and universal at 1, 4, 8 and 16 workers on the 200M ZeRO-3 demo, health on the ZeRO-2 one (with the copy
# check), then the rank sweep (scan, convert, health, universal at 8, 1,024 and 4,096 ranks, default workers)
# with preflight against each run. Needs only python3 with numpy, ml_dtypes, rich, humanize and psutil (no
# install, no network, no git: the tree may be a copy).
#
#     ZI_COMMIT=$(git rev-parse --short HEAD)   # here, to name the commit in the rows
#     OUT=/some/dir sh tests/benchmarks/device_sweep.sh
#
# Sized for one call of ~4-5 minutes on a 16-core machine (2026-12-04 on a 16-core VM: 205 s with workers
# 1 4 16; the timings are in $OUT/log.txt). Each part writes its rows and its results.md section into $OUT as
# it ends, so a call stopped at its limit still brings back what finished: the most wanted part first. Eight
# files at most come back (the device tool's limit): machine.txt, log.txt, and a .md and a .json a part.
# Append the sections to tests/benchmarks/results.md by hand, saying which machine gave them. machine.txt
# records the kernel, and preflight's probes beside the rates of the work they stand for (`probes.py`). A
# sandboxed kernel (gVisor reports 4.4.0) may not honour POSIX_FADV_DONTNEED, so the parts here run warm only.
# Since 2026-12-04 local passes hold --workers to their ceiling under the GIL (4; universal 8:
# `limits.workers`), so the rows at 8 and 16 workers measure that rule: no slower than at 4 (or 8).
set -eu
OUT=${OUT:-/tmp/zi-device-out}
WORK=${WORK:-/tmp/zi-device}
PARAMS=${PARAMS:-200M}
WORKERS=${WORKERS:-1 4 8 16}
RANKS=${RANKS:-8 1024 4096}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
LOG="$OUT/log.txt"
{ nproc; uname -a; "$PY" --version; free -g 2>/dev/null || true; df -h "$WORK" 2>/dev/null || true
  "$PY" tests/benchmarks/probes.py || true; } > "$OUT/machine.txt" 2>&1
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$LOG"; }
for STAGE in 3 2; do
    ROOT="$WORK/demo-$PARAMS-s$STAGE"
    stamp "demo $PARAMS stage $STAGE"
    [ -f "$ROOT/latest" ] || "$PY" -m inspector demo "$ROOT" --params "$PARAMS" --stage "$STAGE" --overwrite >> "$LOG" 2>&1
    WHAT="health bf16 universal"
    [ "$STAGE" = 2 ] && WHAT="health"
    stamp "workers sweep stage $STAGE: $WHAT at $WORKERS"
    # shellcheck disable=SC2086
    "$PY" tests/benchmarks/sweep.py --root "$ROOT" --workdir "$WORK" --workers $WORKERS --cache warm \
        --commands $WHAT --rows-json "$OUT/s$STAGE.json" > "$OUT/s$STAGE.md" 2>&1 || stamp "sweep exit $? (a target missed, or a run failed: see the rows)"
done
stamp "rank sweep at $RANKS"
# shellcheck disable=SC2086
"$PY" tests/benchmarks/ranks.py --workdir "$WORK/ranks" --ranks $RANKS --also health universal \
    --rows-json "$OUT/ranks.json" > "$OUT/ranks.md" 2>&1 || stamp "rank sweep exit $?"
{ echo "probes at the end:"; "$PY" tests/benchmarks/probes.py || true; } >> "$OUT/machine.txt" 2>&1
stamp "done"
tail -n 30 "$OUT/s3.md" "$OUT/s2.md" "$OUT/ranks.md" "$LOG"
