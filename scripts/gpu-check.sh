#!/usr/bin/env bash
# scripts/gpu-check.sh: the one script that checks Strata on a GPU.
#
#   scripts/gpu-check.sh build    # here (no GPU needed): build release binaries into .carry/
#   scripts/gpu-check.sh build-cli  # here: only the `strata` binary into .carry/ (for bench steps)
#   scripts/gpu-check.sh run      # on the GPU machine: run every step, logs to $OUT (or ./gpu-logs)
#
# Typical use from the development machine: `scripts/gpu-check.sh build`, then run
# `bash scripts/gpu-check.sh run` on the device machine with carry [".carry"].
# `run` takes an optional list of step names (default: all), e.g. `run info gpu-tests`.
#
# Adding a step: write a function `step_<name>` that runs one command with `log <name> ...`,
# append <name> to STEPS, and (for a new test binary) add its package to TEST_PACKAGES. Each
# step's log lands in $OUT/<name>.log; the summary table is printed last and saved to
# $OUT/summary.txt. Only 8 files come back from the device machine, so steps that write more
# should bundle them (see step_gpu_micro: its JSON record, SVG and PNG).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.carry"
TARGET="${CARGO_TARGET_DIR:-/work/target-gpu}"
# Test binaries to carry: cargo packages whose tests need a GPU.
TEST_PACKAGES=(strata-gpu strata-unified strata-broker)
# Cargo features a test package needs for its GPU tests.
declare -A TEST_FEATURES=([strata-broker]=gpu)
STEPS=(info ceilings gpu_tests gpu_micro gpu_store examples)
# Example programs to carry and run (`cargo run --example` names of strata-gpu).
GPU_EXAMPLES=(oversubscribed_kernel)
# Arguments of `strata bench gpu-micro` (override with GPU_MICRO_ARGS).
GPU_MICRO_ARGS="${GPU_MICRO_ARGS:-}"

# Only the `strata` binary (the benchmark steps need nothing else): faster than `build`.
build_cli() {
    set -e
    cd "$ROOT"
    export CARGO_TARGET_DIR="$TARGET"
    mkdir -p "$CARRY"
    cargo build --release -p strata-cli
    cp "$TARGET/release/strata" "$CARRY/strata"
    strip --strip-debug "$CARRY/strata"
    ls -la "$CARRY/strata"
}

build() {
    set -e
    build_cli
    mkdir -p "$CARRY/tests" "$CARRY/examples"
    for ex in "${GPU_EXAMPLES[@]}"; do
        cargo build --release -p strata-gpu --example "$ex"
        cp "$TARGET/release/examples/$ex" "$CARRY/examples/$ex"
    done
    for pkg in "${TEST_PACKAGES[@]}"; do
        rm -f "$CARRY/tests/${pkg}__"*
        # shellcheck disable=SC2086
        cargo test --release -p "$pkg" ${TEST_FEATURES[$pkg]:+--features ${TEST_FEATURES[$pkg]}} --no-run --message-format=json 2>/dev/null |
            python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"], m["executable"])' |
            while read -r name exe; do cp "$exe" "$CARRY/tests/${pkg}__${name}"; done
    done
    # Debug info is not needed there, and the carried tree must stay under 64 MiB in all.
    strip --strip-debug "$CARRY/strata" "$CARRY"/tests/* "$CARRY"/examples/*
    ls -la "$CARRY" "$CARRY/tests"
    du -sh "$CARRY"
}

OUT="${OUT:-$ROOT/gpu-logs}"
SUMMARY=()

log() { # log <name> <command...>: runs the command, output to $OUT/<name>.log, records pass/fail
    local name="$1"; shift
    local start end rc
    start=$(date +%s)
    "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    end=$(date +%s)
    SUMMARY+=("$(printf '%-28s %-6s %5ss  %s' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL:$rc)" "$((end - start))" "$(tail -n 1 "$OUT/$name.log" | cut -c1-70)")")
    return $rc
}

step_info() { log info "$CARRY/strata" info; }

# This machine's ceilings (PCIe by SMs and copy engine, page gathers, HBM, host memory, disk),
# cached for the benchmarks that follow, which report their fraction of them.
step_ceilings() { log ceilings timeout 180 "$CARRY/strata" bench ceilings --dir /tmp; }

step_examples() {
    # The GPU example programs: a kernel over a space four times its 256 MiB cache, checked.
    local ex rc=0
    for ex in "${GPU_EXAMPLES[@]}"; do
        log "example-$ex" timeout 120 "$CARRY/examples/$ex" 256 || rc=1
    done
    return $rc
}

step_gpu_tests() {
    # Every test of every carried test binary, each in its own process with its own time limit
    # (a hang costs one test, not the run). One log for all.
    local all=0 t name test passed failed
    : >"$OUT/gpu-tests.log"
    for t in "$CARRY"/tests/*; do
        name=$(basename "$t")
        passed=0
        failed=0
        while read -r test; do
            echo "=== $name :: $test" >>"$OUT/gpu-tests.log"
            if (cd "$ROOT" && timeout "${GPU_TEST_TIMEOUT:-90}" "$t" --exact "$test" --nocapture >>"$OUT/gpu-tests.log" 2>&1); then
                passed=$((passed + 1))
            else
                failed=$((failed + 1))
                all=1
                echo "!!! FAILED (or timed out): $name :: $test" >>"$OUT/gpu-tests.log"
                SUMMARY+=("$(printf '%-28s %-6s %s' "test:$name" FAIL "$test")")
            fi
        done < <("$t" --list 2>/dev/null | sed -n 's/: test$//p')
        SUMMARY+=("$(printf '%-28s %-6s %s' "tests:$name" "$([ $failed -eq 0 ] && echo ok || echo FAIL)" "$passed passed, $failed failed")")
    done
    return $all
}

# Issue 11's targets: spaces over stores (memory, file on the device's disk, a memory node on
# loopback) against each store's raw read_batch rate, the host-cache and cold-4k targets, and
# read-modify-write against chunked copies. GPU_STORE_FILE names the file store's path.
step_gpu_store() {
    local f="${GPU_STORE_FILE:-/var/tmp/strata-gpu-store.bin}"
    log gpu-store timeout 540 "$CARRY/strata" bench gpu-store --targets all \
        --store memory --store "file:$f" --local-node --out "$OUT/gpu-store" ${GPU_STORE_ARGS:-}
    local rc=$?
    rm -f "$f"
    return $rc
}

# The lending broker with real GPUs (issue 13, inter-job): VMM chunks of GPU 1 lent to a
# borrower process on GPU 0, reclaim latency of 1 GiB, killed borrower, killed broker. Needs two
# GPUs (skips otherwise). Its tests also run in gpu_tests; this step runs only them, in order,
# with their RESULT lines. Not in the default STEPS; name it: `run broker`.
step_broker() {
    log broker timeout 300 "$CARRY/tests/strata-broker__gpu" --test-threads=1 --nocapture
}

step_gpu_micro() {
    # shellcheck disable=SC2086
    log gpu-micro timeout 240 "$CARRY/strata" bench gpu-micro --out "$OUT/gpu-micro" $GPU_MICRO_ARGS
}

# Before/after: when a release binary of an earlier commit sits at .carry-before/strata-before,
# run gpu-micro, graph and embed with it and with the new binary, alternated, and compare.
# Not in the default STEPS; name it: `run before_after`. BEFORE_AFTER_ROUNDS (default 2).
step_before_after() {
    local old="$ROOT/.carry-before/strata-before" new="$CARRY/strata" rc=0 i v bin
    [ -x "$old" ] || { echo "no $old: skipped" >"$OUT/before-after.log"; return 0; }
    local micro=(--ratios 1,4 --reps 5 --skip-uvm --patterns cold-4k,stream-read,stream-rmw,gather-uniform,gather-zipf)
    : >"$OUT/before-after.log"
    for i in $(seq "${BEFORE_AFTER_ROUNDS:-2}"); do
        for v in old new; do
            bin=$new; [ $v = old ] && bin=$old
            echo "=== gpu-micro $v round $i" >>"$OUT/before-after.log"
            STRATA_KERNEL_CACHE=/tmp/kc-$v timeout 240 "$bin" bench gpu-micro "${micro[@]}" \
                --out "$OUT/micro-$v-$i" >>"$OUT/before-after.log" 2>&1 || rc=1
        done
    done
    for v in old new; do
        bin=$new; [ $v = old ] && bin=$old
        echo "=== graph/embed $v" >>"$OUT/before-after.log"
        STRATA_KERNEL_CACHE=/tmp/kc-$v timeout 240 "$bin" bench graph --scale 21 --algorithms bfs,pagerank \
            --oversubscription 2,4 --reps 3 --json "$OUT/graph-$v.json" --svg "$OUT/graph-$v.svg" \
            >>"$OUT/before-after.log" 2>&1 || rc=1
        STRATA_KERNEL_CACHE=/tmp/kc-$v timeout 240 "$bin" bench embed --rows 2097152 --lookups 4194304 \
            --oversubscription 2,4 --reps 3 --json "$OUT/embed-$v.json" --svg "$OUT/embed-$v.svg" \
            >>"$OUT/before-after.log" 2>&1 || rc=1
    done
    {
        for i in $(seq "${BEFORE_AFTER_ROUNDS:-2}"); do
            echo "== gpu-micro round $i"; "$new" bench compare "$OUT/micro-old-$i.json" "$OUT/micro-new-$i.json"
        done
        echo "== graph"; "$new" bench compare "$OUT/graph-old.json" "$OUT/graph-new.json"
        echo "== embed"; "$new" bench compare "$OUT/embed-old.json" "$OUT/embed-new.json"
    } >"$OUT/compare.txt" 2>&1 || rc=1
    SUMMARY+=("$(printf '%-28s %-6s %s' before-after "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "see compare.txt")")
    return $rc
}

# Background write-back side by side: the same binary with STRATA_GPU_WRITE_BACK=off and on
# (the default), alternated, on the patterns it should help (read-modify-write streams over the
# pinned host copy and over a memory store) and two it must not hurt (stream-read, gathers).
# Not in the default STEPS; name it: `run write_back`. WRITE_BACK_ROUNDS (default 2).
step_write_back() {
    local rc=0 i wb
    local micro=(--ratios 2,4 --reps 5 --skip-uvm --patterns stream-rmw,stream-read,gather-uniform)
    : >"$OUT/write-back.log"
    for i in $(seq "${WRITE_BACK_ROUNDS:-2}"); do
        for wb in off on; do
            echo "=== gpu-micro write-back $wb round $i" >>"$OUT/write-back.log"
            STRATA_GPU_WRITE_BACK=$wb timeout 200 "$CARRY/strata" bench gpu-micro "${micro[@]}" \
                --out "$OUT/wb-micro-$wb-$i" >>"$OUT/write-back.log" 2>&1 || rc=1
            echo "=== gpu-store stream-rmw write-back $wb round $i" >>"$OUT/write-back.log"
            STRATA_GPU_WRITE_BACK=$wb timeout 200 "$CARRY/strata" bench gpu-store --targets stream-rmw \
                --store memory --out "$OUT/wb-store-$wb-$i" >>"$OUT/write-back.log" 2>&1 || rc=1
        done
    done
    {
        for i in $(seq "${WRITE_BACK_ROUNDS:-2}"); do
            echo "== gpu-micro round $i (off -> on)"; "$CARRY/strata" bench compare "$OUT/wb-micro-off-$i.json" "$OUT/wb-micro-on-$i.json"
        done
    } >"$OUT/write-back-compare.txt" 2>&1 || rc=1
    SUMMARY+=("$(printf '%-28s %-6s %s' write-back "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "see write-back.log")")
    return $rc
}

# Remote access (issue 12): gpu-micro's element patterns with remote access off and at several
# thresholds (how the default was chosen), side by side in one run. Not in the default STEPS;
# name it: `run remote`. REMOTE_SWEEP overrides the thresholds, REMOTE_ARGS the gpu-micro args.
step_remote() {
    local rc=0 t
    # shellcheck disable=SC2206
    local micro=(${REMOTE_ARGS:---cache 256MiB --ratios 2,8 --reps 3 --skip-uvm --no-ceilings --patterns gather-uniform,gather-zipf,rmw-random})
    : >"$OUT/remote.log"
    for t in ${REMOTE_SWEEP:-off auto 4 8 16 32 64 128 256}; do
        echo "=== gpu-micro --remote-access $t" >>"$OUT/remote.log"
        timeout 240 "$CARRY/strata" bench gpu-micro "${micro[@]}" --remote-access "$t" \
            --out "$OUT/remote-$t" >>"$OUT/remote.log" 2>&1 || rc=1
    done
    SUMMARY+=("$(printf '%-28s %-6s %s' remote "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "see remote.log")")
    return $rc
}

# Remote access on the workloads (their page reads of rows and edge lists): embeddings with
# 512-byte rows at 4x and BFS at 2x, remote access off and on, against zero-copy in the same
# run. Not in the default STEPS; name it: `run remote_workloads`.
step_remote_workloads() {
    local rc=0 r
    : >"$OUT/remote-workloads.log"
    for r in off auto; do
        echo "=== embed, remote access $r" >>"$OUT/remote-workloads.log"
        STRATA_GPU_REMOTE_ACCESS=$r timeout 200 "$CARRY/strata" bench embed --rows 4194304 --dim 128 \
            --lookups 8388608 --oversubscription 4 --modes strata,zero-copy --reps 3 \
            --json "$OUT/embed-$r.json" --svg "$OUT/embed-$r.svg" >>"$OUT/remote-workloads.log" 2>&1 || rc=1
        echo "=== graph, remote access $r" >>"$OUT/remote-workloads.log"
        STRATA_GPU_REMOTE_ACCESS=$r timeout 200 "$CARRY/strata" bench graph --scale 23 --algorithms bfs \
            --oversubscription 2 --modes strata,zero-copy --reps 3 \
            --json "$OUT/graph-$r.json" --svg "$OUT/graph-$r.svg" >>"$OUT/remote-workloads.log" 2>&1 || rc=1
    done
    SUMMARY+=("$(printf '%-28s %-6s %s' remote-workloads "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "see remote-workloads.log")")
    return $rc
}

# Issue 13's peer tier (two GPUs: the device kind nvidia-h200-x2): `strata bench peer --check`
# (the graph and embedding checks with every space borrowing GPU 1's memory), then the
# benchmark (NVLink ceilings, peer fault rates, gpu-micro patterns, PageRank and embeddings
# against host-only eviction). Five files: peer-check.log, peer-bench.log, peer.json, peer.svg,
# peer.png. Not in the default STEPS (one GPU refuses); name it: `run peer_bench`.
# PEER_BENCH_ARGS adds arguments (e.g. --quick, --peer 1:16GiB, --sections faults).
step_peer_bench() {
    local rc=0
    log peer-check timeout 150 "$CARRY/strata" bench peer --check || rc=1
    # shellcheck disable=SC2086
    log peer-bench timeout "${PEER_BENCH_TIMEOUT:-300}" "$CARRY/strata" bench peer \
        --json "$OUT/peer.json" --plot "$OUT/peer" ${PEER_BENCH_ARGS:-} || rc=1
    return $rc
}

run() {
    mkdir -p "$OUT"
    export STRATA_KERNEL_CACHE="${STRATA_KERNEL_CACHE:-/tmp/strata-kernel-cache}"
    local steps=("$@")
    [ ${#steps[@]} -eq 0 ] && steps=("${STEPS[@]}")
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
    local failed=0
    for s in "${steps[@]}"; do
        "step_${s//-/_}" || failed=1
    done
    rm -rf "$STRATA_KERNEL_CACHE"
    {
        echo "== gpu-check summary ($(date -u +%FT%TZ), $(head -n 2 "$OUT/nvidia-smi.txt" | tail -n 1))"
        printf '%s\n' "${SUMMARY[@]}"
    } | tee "$OUT/summary.txt"
    return $failed
}

case "${1:-}" in
    build) build ;;
    build-cli) build_cli ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 build | build-cli | run [step...]   (steps: ${STEPS[*]}; also before_after write_back remote remote_workloads peer_bench)" >&2; exit 2 ;;
esac
