#!/usr/bin/env bash
# Two builds of `strata` on 4 KiB embedding rows, one device call from the repository root with
# carry [".carry-bench"] holding both: `strata bench embed --dim 1024` (8 GiB table, Zipf 0.99,
# Strata at 1x/2x/4x beside zero-copy) alternated twice, then `--check --dim 1024` with the
# second build. Logs e1024-<build>-<i>.log and check-<build>.log in $OUT.
#
#   bash scripts/experiments/embed_4k_ab.sh strata strata-b2    # session 11: register bound
#   bash scripts/experiments/embed_4k_ab.sh strata strata-view  # session 11: optimistic reads
set -u
[ $# -eq 2 ] || { echo "usage: $0 BUILD_A BUILD_B (binaries in .carry-bench)" >&2; exit 2; }
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
for i in 1 2; do for b in "$1" "$2"; do
  mkdir -p /tmp/e-$b-$i && (cd /tmp/e-$b-$i && timeout 110 $C/$b bench embed --dim 1024 --rows 2097152 \
    --lookups 4194304 --modes strata,zero-copy) > $OUT/e1024-$b-$i.log 2>&1
  echo "e1024 $b $i exit $?"; grep -E "^embed " $OUT/e1024-$b-$i.log | tail -4
done; done
(cd /tmp && timeout 90 $C/$2 bench embed --check --dim 1024) > $OUT/check-$2.log 2>&1
echo "check $2: exit $?"; tail -1 $OUT/check-$2.log
