#!/bin/sh
# Issue 43's checks on a many-core machine, in one call, most wanted first:
# 1. cores (CORES, default 1 4 16): health against its read floor, convert --dtype bf16 and universal on the
#    200M ZeRO-3 demo and health on the ZeRO-2 one (with the copy check), each pinned to that many of the
#    CPUs at the workers the rule gives them (min(cores, 4)): what "at 1, 4 and 16 cores" asks;
# 2. the rank sweep (scan, convert, health, universal at 8, 1,024 and 4,096 ranks, default workers);
# 3. the worker sweep on every core (WORKERS, default 1 4 8 16): since 2026-12-04 local passes hold
#    --workers to their ceiling under the GIL (4; universal 8: `limits.workers`), so the rows at 8 and 16
#    measure that rule, no slower than at 4 (or 8).
# Each with preflight against each run. Needs only python3 with numpy, ml_dtypes, rich, humanize and psutil
# (no install, no network, no git, no taskset: the tree may be a copy).
#
#     ZI_COMMIT=$(git rev-parse --short HEAD)   # here, to name the commit in the rows
#     OUT=/some/dir sh tests/benchmarks/device_sweep.sh
#
# Sized for one call of ~5-6 minutes on a 16-core machine (2026-12-04 on a 16-core VM: 205 s for parts 2
# and 3 with workers 1 4 16; the timings are in $OUT/log.txt). Each part gathers its rows into $OUT as it
# ends, so a call stopped at its limit still brings back what finished. Eight files at most come back (the
# device tool's limit): machine.txt, log.txt, cores.md/.json, ranks.md/.json, workers.md/.json (each row of
# the .json names its part and the cores it ran on; fit_preflight.py reads them as they are). Append the
# sections to tests/benchmarks/results.md by hand, saying which machine gave them. machine.txt records the
# kernel, and preflight's probes beside the rates of the work they stand for (`probes.py`). A sandboxed
# kernel (gVisor reports 4.4.0) may not honour POSIX_FADV_DONTNEED, so the parts here run warm only.
set -eu
OUT=${OUT:-/tmp/zi-device-out}
WORK=${WORK:-/tmp/zi-device}
PARAMS=${PARAMS:-200M}
CORES=${CORES:-1 4 16}
WORKERS=${WORKERS:-1 4 8 16}
RANKS=${RANKS:-8 1024 4096}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
LOG="$OUT/log.txt"
{ nproc; uname -a; "$PY" --version; free -g 2>/dev/null || true; df -h "$WORK" 2>/dev/null || true
  "$PY" tests/benchmarks/probes.py || true; } > "$OUT/machine.txt" 2>&1
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$LOG"; }
# run a command on the first $1 of the CPUs this process may use (its children inherit them)
pinned() { "$PY" -c 'import os, sys
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: int(sys.argv[1])])
os.execvp(sys.argv[2], sys.argv[2:])' "$@"; }
# the parts' rows gathered into one .md and one .json under $OUT as each part ends (the tool's file limit)
gather() { NAME=$1; shift
    cat "$@" > "$OUT/$NAME.md" 2>/dev/null || true
    "$PY" -c 'import json, os, sys
rows, head = [], {}
for md in sys.argv[2:]:
    js = md[:-3] + ".json"
    if os.path.exists(js):
        data = json.load(open(js))
        head = head or {k: v for k, v in data.items() if k != "rows"}
        part = os.path.basename(js)[:-5]
        rows += [dict(r, part=part, part_cores=data.get("cores")) for r in data["rows"]]
json.dump(dict(head, rows=rows), open(sys.argv[1], "w"), indent=1)' "$OUT/$NAME.json" "$@" || true; }
for STAGE in 3 2; do
    ROOT="$WORK/demo-$PARAMS-s$STAGE"
    stamp "demo $PARAMS stage $STAGE"
    [ -f "$ROOT/latest" ] || "$PY" -m inspector demo "$ROOT" --params "$PARAMS" --stage "$STAGE" --overwrite >> "$LOG" 2>&1
done
sweep() {  # sweep.py on the first $1 CPUs over the demo of stage $2 at workers $3, its rows into $WORK/$4.*
    WHAT="health bf16 universal"  # ZeRO-2's demo: health alone (its copy check)
    [ "$2" = 2 ] && WHAT="health"
    stamp "$4: $WHAT on $1 CPUs at workers $3"
    # shellcheck disable=SC2086
    pinned "$1" "$PY" tests/benchmarks/sweep.py --root "$WORK/demo-$PARAMS-s$2" --workdir "$WORK" --workers $3 \
        --cache warm --commands $WHAT --rows-json "$WORK/$4.json" > "$WORK/$4.md" 2>&1 \
        || stamp "$4: exit $? (a target missed, or a run failed: see the rows)"
}
# issue 43's "at 1, 4 and 16 cores": each command pinned to that many cores at the workers the rule gives
# them by default (min(cores, 4) under the GIL), health against its floor on both demos
DONE=""
for C in $CORES; do
    [ "$C" -le "$(nproc)" ] || continue
    for STAGE in 3 2; do
        sweep "$C" "$STAGE" $(( C < 4 ? C : 4 )) "c$C-s$STAGE"
        DONE="$DONE $WORK/c$C-s$STAGE.md"
    done
    # shellcheck disable=SC2086
    gather cores $DONE
done
stamp "rank sweep at $RANKS"
# shellcheck disable=SC2086
"$PY" tests/benchmarks/ranks.py --workdir "$WORK/ranks" --ranks $RANKS --also health universal \
    --rows-json "$OUT/ranks.json" > "$OUT/ranks.md" 2>&1 || stamp "rank sweep exit $?"
# the worker sweep on all the cores: past the ceiling (4; universal 8) --workers runs as the ceiling
DONE=""
for STAGE in 3 2; do
    sweep "$(nproc)" "$STAGE" "$WORKERS" "s$STAGE"
    DONE="$DONE $WORK/s$STAGE.md"
    # shellcheck disable=SC2086
    gather workers $DONE
done
{ echo "probes at the end:"; "$PY" tests/benchmarks/probes.py || true; } >> "$OUT/machine.txt" 2>&1
stamp "done"
tail -n 30 "$OUT/cores.md" "$OUT/ranks.md" "$OUT/workers.md" "$LOG"
