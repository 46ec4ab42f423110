#!/usr/bin/env bash
# Session 11 review, one device call from the repository root with carry [".carry-bench"]
# (`strata` and `tests/strata-unified__gpu` of the reviewed tree): the host-link experiments
# rebuilt on their shared header, `strata bench embed --check` at 512-byte and 4 KiB rows, the
# unified allocations' GPU tests.
set -u
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
for x in tma_host_read sm_duplex; do
  nvcc -O2 -arch=sm_90 -o /tmp/$x scripts/experiments/$x.cu && /tmp/$x > $OUT/$x.log 2>&1
  echo "$x exit $?"; cat $OUT/$x.log
done
for d in 128 1024; do
  (cd /tmp && timeout 90 $C/strata bench embed --check --dim $d) > $OUT/embed-check-$d.log 2>&1
  echo "embed check dim $d: exit $?"; tail -1 $OUT/embed-check-$d.log
done
timeout 150 $C/tests/strata-unified__gpu --test-threads 1 --nocapture > $OUT/unified-tests.log 2>&1
echo "unified tests: exit $?"; grep -E "test result|FAILED|panicked" $OUT/unified-tests.log | head -5
