#!/usr/bin/env bash
# Session 10 before/after on a device, one call, from the repository root with carry
# [".carry-bench"]: `strata` (this tree) and `strata-prev` (the commit before, stripped).
#  1. gpu-micro's hot path (issue 12): 4 KiB gathers and updates at 1x and 2x, sub-page fetch
#     off (the default), the two binaries alternated twice;
#  2. the read-mostly table of `strata bench unified` (issue 14), alternated twice, 50 rounds;
#  3. gpu-micro over 64 KiB pages with 4 KiB sectors, remote access off (sub-page fetch on:
#     its faults and part-page hits), both binaries.
set -u
C=${CARRY_DIR:-.carry-bench}
for i in 1 2; do for b in strata-prev strata; do
  timeout 120 $C/$b bench gpu-micro --no-ceilings --skip-uvm --ratios 1,2 --reps 5 \
    --patterns gather-uniform,gather-zipf,rmw-random-4k --out $OUT/ab-$b-$i > $OUT/ab-$b-$i.log 2>&1
  echo "ab $b $i exit $?"
done; done
for i in 1 2; do for b in strata-prev strata; do
  timeout 100 $C/$b bench unified --cases table --rounds 50 --out $OUT/table-$b-$i > $OUT/table-$b-$i.log 2>&1
  echo "table $b $i exit $?"
done; done
for b in strata-prev strata; do
  timeout 140 $C/$b bench gpu-micro --no-ceilings --skip-uvm --ratios 2,8 --reps 3 --gather-page 64KiB --sector 4KiB \
    --remote-access off --patterns gather-uniform,gather-zipf,rmw-random-64k --out $OUT/sector-$b > $OUT/sector-$b.log 2>&1
  echo "sector $b exit $?"
done
cd $OUT && tar czf all.tgz *.log *.json && rm -f *.json *.svg *.png
for f in ab-*.log sector-*.log; do echo "== $f"; grep -E "^(gather|rmw|stream)" $f | cut -c1-120 | sort -u; done
for f in table-*.log; do echo "== $f"; grep -E "^(table|  *table)|strata|managed" $f | cut -c1-160 | head -8; done
