#!/usr/bin/env bash
# Session 11, issue 12, one device call with carry [".carry-bench"]: does the 4 KiB-row space
# gather gain from two blocks per SM (`strata-b2`: `__launch_bounds__(256, 2)` for rows over
# 1 KiB, 128 registers and 510 bytes of spills) over one (`strata`: 240 registers, no bound)?
# `strata bench embed --dim 1024` alternated twice, then `--check --dim 1024` with strata-b2.
set -u
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
for i in 1 2; do for b in strata strata-b2; do
  mkdir -p /tmp/e-$b-$i && (cd /tmp/e-$b-$i && timeout 110 $C/$b bench embed --dim 1024 --rows 2097152 \
    --lookups 4194304 --modes strata,zero-copy) > $OUT/e1024-$b-$i.log 2>&1
  echo "e1024 $b $i exit $?"; grep -E "^embed " $OUT/e1024-$b-$i.log | tail -4
done; done
(cd /tmp && timeout 90 $C/strata-b2 bench embed --check --dim 1024) > $OUT/check-b2.log 2>&1
echo "check b2: exit $?"; tail -1 $OUT/check-b2.log
