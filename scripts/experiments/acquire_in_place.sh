#!/usr/bin/env bash
# scripts/experiments/acquire_in_place.sh: one device call for two questions.
#  1. What does an acquire load of a page word compile to (acquire_sass.cu)?
#  2. BFS, Kronecker scale 25 at 2x: does reading in-place rows after a relaxed (not acquire)
#     load of the page word close the gap to zero-copy? Two `strata` binaries alternate,
#     A = main, B = main with the relaxed load (an experiment, unsafe in general), each with
#     its own kernel cache.
# Carry: .carry-exp (strata-a, strata-b, strata_unified = the unified lib tests, run N times
# as a race check). Logs to $OUT.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
C="$ROOT/.carry-exp"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
nvcc -arch=sm_90 -cubin -o /tmp/a.cubin "$ROOT/scripts/experiments/acquire_sass.cu" &&
    cuobjdump -sass /tmp/a.cubin > "$OUT/sass-full.txt" 2>&1
grep -E 'Function|CCTL|LDG|LD\.|ATOM|MEMBAR|FENCE|ERRBAR' "$OUT/sass-full.txt" > "$OUT/sass.txt"
echo "sass: $(grep -c CCTL "$OUT/sass.txt") CCTL lines" | tee -a "$OUT/summary.txt"
if [ -n "${UNIFIED_RUNS:-}" ]; then
    for i in $(seq "$UNIFIED_RUNS"); do
        (cd "$ROOT" && timeout 90 "$C/strata_unified" --test-threads 8) >"$OUT/unified-lib-$i.log" 2>&1
        echo "unified lib run $i: exit $? $(grep 'test result' "$OUT/unified-lib-$i.log" | tail -1)" | tee -a "$OUT/summary.txt"
    done
fi
G="--scale 25 --graph-file /tmp/k25.bin --algorithms bfs --oversubscription 2 --reps 3 --modes strata,zero-copy"
for round in ${ROUNDS:-1 2}; do
    for v in a b; do
        STRATA_KERNEL_CACHE=/tmp/kc-$v timeout 200 "$C/strata-$v" bench graph $G \
            --json "$OUT/bfs-$v-$round.json" >"$OUT/bfs-$v-$round.log" 2>&1
        echo "bfs $v round $round: exit $? $(grep -iE 'strata|zero-copy' "$OUT/bfs-$v-$round.log" | grep -E 'ms' | tr -s ' ' | tr '\n' '|' | cut -c1-300)" | tee -a "$OUT/summary.txt"
    done
done
cd "$OUT" && tar czf logs.tgz *.log *.json sass-full.txt 2>/dev/null; rm -f unified-lib-*.log bfs-*.log bfs-*.json
