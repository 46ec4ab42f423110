#!/usr/bin/env bash
# scripts/gpu-all.sh: every GPU check of the repository in one device call, its logs bundled so
# that they fit the device tool's eight returned files.
#
#   here:   CARGO_TARGET_DIR=$PWD/target scripts/gpu-check.sh build
#           crates/strata-c/gpu-check.sh build        # libstrata.so + wheel into .carry-py/
#           scripts/gpu-copy.sh build                  # strata-copy tests into .carry-copy/
#   there:  bash scripts/gpu-all.sh checks             # carry .carry .carry-py .carry-copy
#           bash scripts/gpu-all.sh before-after       # also carry .carry-before (old binary)
#           bash scripts/gpu-all.sh ceilings           # this machine's ceilings only
#
# `checks`: strata info, measured ceilings, every GPU test (strata-gpu), the GPU example, the C
# library's GPU branch and nvcc example, the Python package's GPU tests, the strata-copy suite.
# `before-after`: gpu-micro, graph and embed with .carry-before/strata-before and the new
# binary, alternated, then `strata bench compare`.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FINAL_OUT="${OUT:-$ROOT/gpu-logs}"
LOGS=$(mktemp -d)
mkdir -p "$FINAL_OUT"
rc=0
case "${1:-}" in
checks)
    OUT="$LOGS/check" bash "$ROOT/scripts/gpu-check.sh" run info ceilings gpu_tests examples || rc=1
    OUT="$LOGS/c-py" bash "$ROOT/crates/strata-c/gpu-check.sh" run >"$LOGS/c-py.log" 2>&1 || rc=1
    if [ -x "$ROOT/.carry-copy/test_gpu_sanity" ]; then
        mkdir -p "$LOGS/copy"
        (
            cd "$ROOT/.carry-copy" &&
                timeout 180 ./test_ring_emulated &&
                timeout 180 ./test_nvrtc &&
                timeout 60 ./test_c_api --exact direct_access_to_a_shadow_faults_loudly &&
                timeout 300 ./test_gpu_sanity --test-threads=1 &&
                timeout 120 ./gdr_program "$RANDOM$RANDOM"
        ) >"$LOGS/copy/copy.log" 2>&1 || rc=1
    fi
    {
        cat "$LOGS/check/summary.txt"
        echo "== C library and Python package (crates/strata-c/gpu-check.sh)"
        grep -E '^(== |FAILED)|passed|failed' "$LOGS/c-py.log"
        echo "== strata-copy"
        grep -E 'test result|passed|FAILED|panicked' "$LOGS/copy/copy.log"
    } >"$FINAL_OUT/summary.txt" 2>&1
    cp "$LOGS"/check/gpu-tests.log "$FINAL_OUT/" 2>/dev/null
    cp "$LOGS"/check/ceilings.log "$FINAL_OUT/" 2>/dev/null
    ;;
before-after)
    OUT="$LOGS/ba" BEFORE_AFTER_ROUNDS="${BEFORE_AFTER_ROUNDS:-1}" \
        bash "$ROOT/scripts/gpu-check.sh" run before_after || rc=1
    cp "$LOGS/ba/compare.txt" "$FINAL_OUT/" 2>/dev/null
    cp "$LOGS"/ba/*-new*.png "$FINAL_OUT/" 2>/dev/null
    ;;
ceilings)
    OUT="$LOGS/ceil" bash "$ROOT/scripts/gpu-check.sh" run info ceilings || rc=1
    cp "$LOGS/ceil/ceilings.log" "$LOGS/ceil/info.log" "$FINAL_OUT/" 2>/dev/null
    ;;
*)
    echo "usage: $0 checks | before-after | ceilings" >&2
    exit 2
    ;;
esac
tar czf "$FINAL_OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$FINAL_OUT"/summary.txt "$FINAL_OUT"/compare.txt 2>/dev/null
exit $rc
