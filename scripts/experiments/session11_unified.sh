#!/usr/bin/env bash
# Session 11, issue 14, one device call from the repository root with carry [".carry-bench"]:
# `strata` (this tree), `strata-prev` (6bbd4d6, before hot pages were loaded while hashed and
# before the consume kernel's register bound) and `tests/strata-unified__gpu`.
#  1. the unified allocations' GPU tests;
#  2. `strata bench unified --cases handoff`, the two binaries alternated twice;
#  3. the whole `strata bench unified` once with this tree's binary.
set -u
C=${CARRY_DIR:-.carry-bench}
timeout 200 $C/tests/strata-unified__gpu --test-threads 1 --nocapture > $OUT/unified-tests.log 2>&1
echo "unified tests: exit $? ($(grep -c '\.\.\. ok' $OUT/unified-tests.log) ok)"
for i in 1 2; do for b in strata-prev strata; do
  timeout 90 $C/$b bench unified --cases handoff --out $OUT/handoff-$b-$i > $OUT/handoff-$b-$i.log 2>&1
  echo "handoff $b $i exit $?"
done; done
mkdir -p $OUT/all
timeout 150 $C/strata bench unified --out $OUT/all > $OUT/all.log 2>&1
echo "all exit $?"
cd $OUT && tar czf all.tgz *.log all handoff-*/ 2>/dev/null
for f in handoff-*.log all.log; do echo "== $f"; grep -E "^handoff|^table|^sweep|^layers" $f | grep -v "^case" | cut -c1-250 | sort -u; done
grep -E "test result|FAILED|panicked" unified-tests.log | head
