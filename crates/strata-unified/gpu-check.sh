#!/usr/bin/env bash
# crates/strata-unified/gpu-check.sh: checks unified allocations on a GPU machine.
#
#   crates/strata-unified/gpu-check.sh build   # here: release GPU test binaries of
#                                              # strata-unified, libstrata.so, the strata binary,
#                                              # the headers, C test, example and this script into
#                                              # $CARRY (default .carry-unified/ of the checkout
#                                              # the device tool copies, /work/main; git-ignored)
#   bash .carry-unified/gpu-check.sh run       # there (CUDA 13, nvcc, no Rust): the GPU tests,
#                                              # the C API test's GPU branch, the nvcc example,
#                                              # `strata bench unified`; logs and JSON to $OUT
#   (`build nocli` skips the strata binary, for runs without the benchmark)
#
# `run` takes step names (default: all): tests c example bench; also tests-quick (the GPU
# tests of data that fits the cache, a subset) and tests-store (the allocations over a store).
set -u -o pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# Built here into the device tool's checkout; run there from the carried copy itself.
CARRY="${CARRY:-/work/main/.carry-unified}"
# Faster release builds on the 2-core development machine (no LTO): the timings that matter
# are the GPU's and the copies', not the last percent of host code.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=0

build() {
    set -e
    cd "$ROOT"
    mkdir -p "$CARRY/tests"
    nice cargo build --release -p strata-c
    cp target/release/libstrata.so "$CARRY/"
    if [ "${1:-}" != nocli ]; then
        nice cargo build --release -p strata-cli
        cp target/release/strata "$CARRY/"
    fi
    rm -f "$CARRY"/tests/*
    nice cargo test --release -p strata-unified --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"], m["executable"])' |
        while read -r name exe; do cp "$exe" "$CARRY/tests/$name"; done
    strip --strip-debug "$CARRY/libstrata.so" "$CARRY"/tests/*
    [ -f "$CARRY/strata" ] && strip --strip-debug "$CARRY/strata"
    mkdir -p "$CARRY/include/strata" "$CARRY/src"
    cp crates/strata-c/include/strata.h crates/strata-gpu/cuda/strata.cuh "$CARRY/include/"
    cp crates/strata-gpu/cuda/strata/*.cuh "$CARRY/include/strata/"
    cp crates/strata-c/tests/c/unified_test.c crates/strata-c/tests/c/check.h crates/strata-unified/examples/unified_list.cu "$CARRY/src/"
    cp crates/strata-unified/gpu-check.sh "$CARRY/"
    du -sh "$CARRY"; ls -la "$CARRY" "$CARRY/tests"
}

run() {
    CARRY="$HERE"
    cd "$CARRY"
    OUT="${OUT:-$CARRY/logs}"
    mkdir -p "$OUT"
    nvrtc=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
    export LD_LIBRARY_PATH="${nvrtc:+$nvrtc:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export STRATA_KERNEL_CACHE=/tmp/strata-kernels
    local steps=("$@")
    [ ${#steps[@]} -eq 0 ] && steps=(tests c example bench)
    local status=0
    step() { # step <name> <command...>: output to $OUT/<name>.log
        local name="$1"; shift
        local t0=$SECONDS
        "$@" >"$OUT/$name.log" 2>&1
        local rc=$?
        printf '%-14s %-8s %4ss  %s\n' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL:$rc)" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-90)" | tee -a "$OUT/summary.txt"
        [ $rc -eq 0 ] || status=1
    }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
    for s in "${steps[@]}"; do
        case "$s" in
        tests)
            for t in "$CARRY"/tests/*; do
                step "test-$(basename "$t")" timeout 240 "$t" --test-threads 1 --nocapture
            done
            ;;
        tests-store)
            step test-gpu-store timeout 180 "$CARRY/tests/gpu" --test-threads 1 --nocapture over_a_store
            ;;
        tests-quick)
            step test-gpu-quick timeout 120 "$CARRY/tests/gpu" --test-threads 1 --nocapture \
                fit_the_cache only_changed read_mostly discard both_sides
            ;;
        c)
            work=$(mktemp -d)
            step c-build gcc -std=c11 -Wall -Wextra -Werror -O1 -o "$work/unified_test" \
                src/unified_test.c -Iinclude -L"$CARRY" -lstrata -Wl,-rpath,"$CARRY"
            step c-gpu timeout 120 "$work/unified_test" "$RANDOM$RANDOM" gpu
            ;;
        example)
            work=$(mktemp -d)
            step example-build nvcc -std=c++17 -O2 -arch=sm_90 -Iinclude -o "$work/unified_list" \
                src/unified_list.cu -L"$CARRY" -lstrata -Xlinker -rpath -Xlinker "$CARRY"
            step example-run timeout 120 "$work/unified_list" 200000
            ;;
        bench)
            step bench timeout 400 "$CARRY/strata" bench unified --out "$OUT" ${UNIFIED_BENCH_ARGS:-}
            ;;
        esac
    done
    cat "$OUT/summary.txt"
    return $status
}

case "${1:-}" in
build) shift; build "$@" ;;
run) shift; run "$@" ;;
*) echo "usage: $0 build | run [tests|c|example|bench ...]" >&2; exit 2 ;;
esac
