#!/usr/bin/env bash
# Session 11, issue 12, one device call with carry [".carry-bench"]: does the 4 KiB-row space
# gather gain from the optimistic read (`strata-view`: strata::view_page for rows of every size,
# the row staged in registers until the page word checks out; 242 registers, no spills) over
# the pinned path (`strata`: acquire_page per row, 240 registers)? `strata bench embed --dim
# 1024` alternated twice, then `--check --dim 1024` with strata-view.
set -u
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
for i in 1 2; do for b in strata strata-view; do
  mkdir -p /tmp/e-$b-$i && (cd /tmp/e-$b-$i && timeout 110 $C/$b bench embed --dim 1024 --rows 2097152 \
    --lookups 4194304 --modes strata,zero-copy) > $OUT/e1024-$b-$i.log 2>&1
  echo "e1024 $b $i exit $?"; grep -E "^embed " $OUT/e1024-$b-$i.log | tail -4
done; done
(cd /tmp && timeout 90 $C/strata-view bench embed --check --dim 1024) > $OUT/check-view.log 2>&1
echo "check view: exit $?"; tail -1 $OUT/check-view.log
