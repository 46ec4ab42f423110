#!/usr/bin/env bash
# Session 11, issue 12, one device call from the repository root with carry [".carry-bench"]
# (`strata` of this tree): PageRank and BFS on a Kronecker scale-25 graph at 2x beside
# zero-copy, three invocations of `strata bench graph` (each medians of 3), so the ratios come
# with their spread between invocations (zero-copy's own time moved 2475-2760 ms between calls
# in session 10).
set -u
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
for i in 1 2 3; do
  mkdir -p /tmp/g$i && (cd /tmp/g$i && timeout 170 $C/strata bench graph --scale 25 --graph-file /tmp/k25.bin \
    --algorithms pagerank,bfs --oversubscription 2 --modes strata,zero-copy --reps 3) > $OUT/graph-$i.log 2>&1
  echo "graph $i exit $?"; grep -E "^(pagerank|bfs) " $OUT/graph-$i.log | grep -v median
done
