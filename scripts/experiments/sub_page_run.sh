#!/usr/bin/env bash
# Sub-page fetch on a device (issue 12), one call, from the repository root with carry
# [".carry-bench"]: `strata` (this tree, scripts/gpu-check.sh build), `strata-base` (the commit
# before sub-page fetch, stripped) and the element-access GPU test binaries under tests/.
#  1. the sub-page GPU tests, then the element-access suites with STRATA_GPU_SECTOR=4KiB;
#  2. the hot path before/after: gpu-micro's 4 KiB gathers and updates at 1x and 2x, the two
#     binaries alternated twice (sub-page fetch off, the default);
#  3. gpu-micro over 64 KiB pages with sectors off and 4 KiB, remote access auto and off.
set -u
C=${CARRY_DIR:-.carry-bench}
[ "${SUBPAGE_TESTS:-1}" = 1 ] && (timeout 200 $C/tests/strata-gpu__sub_page --test-threads 1 --nocapture) > $OUT/tests-sub_page.log 2>&1; echo "sub_page exit $?"
[ "${SUBPAGE_TESTS:-1}" = 1 ] && for t in remote_access gpu trust write_back; do
  (STRATA_GPU_SECTOR=4KiB timeout 200 $C/tests/strata-gpu__$t --test-threads 1 --nocapture) > $OUT/tests-sector-$t.log 2>&1; echo "$t sector exit $?"
done
grep -h "test result" $OUT/tests-*.log
# AB_BINARIES: the binaries to alternate (strata-base first); SUBPAGE_TESTS=0 skips step 1,
# SUBPAGE_BENCH=0 step 3.
for i in 1 2; do for b in ${AB_BINARIES:-strata-base strata}; do
  timeout 120 $C/$b bench gpu-micro --no-ceilings --skip-uvm --ratios 1,2 --reps 5 --patterns gather-uniform,gather-zipf,rmw-random-4k --out $OUT/ab-$b-$i > $OUT/ab-$b-$i.log 2>&1; echo "ab $b $i exit $?"
done; done
[ "${SUBPAGE_BENCH:-1}" = 1 ] && for sector in off 4KiB; do for remote in auto off; do
  timeout 140 $C/strata bench gpu-micro --no-ceilings --skip-uvm --ratios 2,8 --reps 3 --gather-page 64KiB --sector $sector --remote-access $remote \
    --patterns gather-uniform,gather-zipf,rmw-random-64k,stream-read --out $OUT/subpage-$sector-$remote > $OUT/subpage-$sector-$remote.log 2>&1
  echo "subpage $sector $remote exit $?"
done; done
cd $OUT && tar czf all.tgz *.log *.json && rm -f *.svg *.png *.json tests-*.log
for f in ab-*.log subpage-*.log; do echo "== $f"; grep -E "^(gather|rmw|stream)" $f | cut -c1-110 | sort -u; done
