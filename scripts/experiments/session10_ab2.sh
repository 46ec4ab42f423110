#!/usr/bin/env bash
# Session 10, second device call (carry [".carry-bench"], as session10_ab.sh):
#  1. rmw-random-4k at 2x alone, the two binaries alternated four times (its spread between
#     runs of one binary is wide);
#  2. the whole `strata bench unified` with each binary (issue 14: every case, the launch
#     helper's single read of the counters included).
set -u
C=${CARRY_DIR:-.carry-bench}
for i in 1 2 3 4; do for b in strata-prev strata; do
  timeout 60 $C/$b bench gpu-micro --no-ceilings --skip-uvm --ratios 2 --reps 5 \
    --patterns rmw-random-4k --out $OUT/rmw2-$b-$i > $OUT/rmw2-$b-$i.log 2>&1
  echo "rmw2 $b $i exit $? $(grep -E '^rmw-random-4k' $OUT/rmw2-$b-$i.log | head -1 | cut -c1-90)"
done; done
for b in strata-prev strata; do
  timeout 200 $C/$b bench unified --out $OUT/unified-$b > $OUT/unified-$b.log 2>&1
  echo "unified $b exit $?"
done
cd $OUT && tar czf all.tgz *.log *.json && rm -f *.json *.svg *.png
for f in unified-*.log; do echo "== $f"; grep -E "^[a-z-]+[0-9x]* +(strata|managed|zero|explicit)[^ ]* +[0-9]+ +[0-9.]+ " $f | cut -c1-60; done
