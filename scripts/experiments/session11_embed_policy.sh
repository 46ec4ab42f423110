#!/usr/bin/env bash
# Session 11, issue 12, one device call with carry [".carry-bench"] (`strata-view`: this tree's
# gather): 4 KiB rows at 4x under the scan-resistant policy (the default, 90 % protected) and
# under clock, alternated twice: how much of the 4x pass is the eviction policy's?
set -u
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
for i in 1 2; do for p in scan-resistant clock; do
  mkdir -p /tmp/p-$p-$i && (cd /tmp/p-$p-$i && timeout 100 $C/strata-view bench embed --dim 1024 --rows 2097152 \
    --lookups 4194304 --modes strata,zero-copy --oversubscription 4 --policy $p) > $OUT/e1024-4x-$p-$i.log 2>&1
  echo "4x $p $i exit $?"; grep -E "^embed " $OUT/e1024-4x-$p-$i.log | tail -2
done; done
