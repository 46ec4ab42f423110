#!/usr/bin/env bash
# Session 11, one device call from the repository root with carry [".carry-bench"]: `strata`
# (this tree), `strata-prev` (6bbd4d6) and `tests/strata-unified__gpu`.
#  1. the unified allocations' GPU tests (issue 14);
#  2. `strata bench embed --check` (bit-exact in every mode) with this tree, 512-byte and 4 KiB rows;
#  3. 4 KiB embedding rows (issue 12: rows that fill their page now migrate on a miss), the two
#     binaries alternated twice, `--modes strata,zero-copy`.
set -u
R=$(pwd)
C=$R/${CARRY_DIR:-.carry-bench}
timeout 150 $C/tests/strata-unified__gpu --test-threads 1 --nocapture > $OUT/unified-tests.log 2>&1
echo "unified tests: exit $? ($(grep -c '\.\.\. ok' $OUT/unified-tests.log) ok)"
grep -E "test result|FAILED|panicked" $OUT/unified-tests.log | head -5
for d in 128 1024; do
  (cd /tmp && timeout 90 $C/strata bench embed --check --dim $d) > $OUT/embed-check-$d.log 2>&1
  echo "embed check dim $d: exit $?"; tail -2 $OUT/embed-check-$d.log
done
for i in 1 2; do for b in strata-prev strata; do
  mkdir -p /tmp/e-$b-$i && (cd /tmp/e-$b-$i && timeout 110 $C/$b bench embed --dim 1024 --rows 2097152 \
    --lookups 4194304 --modes strata,zero-copy) > $OUT/e1024-$b-$i.log 2>&1
  echo "e1024 $b $i exit $?"; grep -E "^embed " $OUT/e1024-$b-$i.log | tail -4
done; done
cd $OUT && tar czf all.tgz *.log
