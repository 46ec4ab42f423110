#!/usr/bin/env bash
# scripts/gpu-workloads.sh: the GPU checks and benchmarks of the workloads (issue 6): BFS, CC
# and PageRank on Kronecker/uniform graphs, and Zipf embedding gathers, through Strata and the
# baselines (zero-copy, UVM where it fits, GPU memory).
#
#   scripts/gpu-workloads.sh build          # here (no GPU needed): release `strata` into .carry/workloads/
#   scripts/gpu-workloads.sh run [step...]  # on the GPU machine (carry [".carry/workloads"])
#
# Steps (default: all, in this order):
#   check        `strata bench graph --check` and `strata bench embed --check`: small inputs,
#                Strata at 4x oversubscription and every baseline, every result validated
#                (Graph500 BFS rules, CC/PageRank vs the CPU, embeddings bit-exact)
#   bench-graph  `strata bench graph` once per ';'-separated argument list in $GRAPH_RUNS
#                (default: one run at the defaults, scale 24; "--scale 25" is the issue's
#                target size). A list may start with STRATA_*=value words, which become that
#                run's environment (e.g. "STRATA_GPU_READ_THROUGH=true --algorithms bfs")
#   bench-embed  `strata bench embed` once per ';'-separated argument list in $EMBED_RUNS
#                (default: 128-float rows, the issue's example, then 1024-float rows, one
#                row per 4 KiB page, over a table of the same 8 GiB)
# Output (two files, as the device machine returns at most 8): $OUT/workloads.log (summary
# first, then every step's log) and $OUT/workloads.tar.gz (JSON, SVG and logs), both rewritten
# after every command, so a run cut short still returns what finished. Each command is stopped
# after $STEP_TIMEOUT seconds (default 400).
# gpu-check.sh can run all of this as one step: `bash scripts/gpu-workloads.sh run`.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.carry/workloads"
TARGET="${CARGO_TARGET_DIR:-/work/target-workloads}"
STEPS=(ceilings check bench-graph bench-embed)
GRAPH_RUNS="${GRAPH_RUNS:-}"
EMBED_RUNS="${EMBED_RUNS:---dim 128;--dim 1024 --rows 2097152 --lookups 4194304}"

build() {
    set -e
    cd "$ROOT"
    CARGO_TARGET_DIR="$TARGET" cargo build --release -p strata-cli
    mkdir -p "$CARRY"
    cp "$TARGET/release/strata" "$CARRY/strata"
    ls -la "$CARRY"
}

OUT="${OUT:-$ROOT/gpu-logs}"
WORK="$(mktemp -d /tmp/strata-workloads.XXXXXX)"
SUMMARY=()

# Seconds one command may run before it is stopped (its log so far is kept).
STEP_TIMEOUT="${STEP_TIMEOUT:-400}"

log() { # log <name> <command...>: output to $WORK/<name>.log, pass/fail and time recorded
    local name="$1"; shift
    local start rc
    start=$(date +%s)
    echo "\$ $*" >"$WORK/$name.log"
    timeout "$STEP_TIMEOUT" "$@" >>"$WORK/$name.log" 2>&1
    rc=$?
    SUMMARY+=("$(printf '%-14s %-7s %5ss  %s' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL:$rc)" "$(($(date +%s) - start))" "$(grep -E 'CHECK PASSED|wrote|Error' "$WORK/$name.log" | tail -n 1 | cut -c1-90)")")
    publish
    return $rc
}

publish() { # rewrites $OUT/workloads.log and $OUT/workloads.tar.gz from what exists so far
    {
        echo "== gpu-workloads summary ($(date -u +%FT%TZ), $(head -n 2 "$WORK/nvidia-smi.txt" 2>/dev/null | tail -n 1))"
        printf '%s\n' "${SUMMARY[@]}"
        for f in "$WORK"/*.log; do
            [ -e "$f" ] || continue
            echo
            echo "=== $(basename "$f")"
            cat "$f"
        done
    } >"$OUT/workloads.log"
    tar -czf "$OUT/workloads.tar.gz" -C "$WORK" --exclude kernel-cache .
}

# This machine's ceilings, cached so every benchmark reports its fraction of them (PCIe read).
step_ceilings() { log ceilings "$CARRY/strata" bench ceilings --dir /tmp; }

step_check() {
    local rc=0
    log check-graph "$CARRY/strata" bench graph --check || rc=1
    log check-embed "$CARRY/strata" bench embed --check || rc=1
    return $rc
}

bench_runs() { # bench_runs <graph|embed> <';'-separated argument lists>
    local what="$1" rc=0 i=0 args
    local -a runs
    IFS=';' read -r -a runs <<<"$2"
    [ ${#runs[@]} -eq 0 ] && runs=("")
    for args in "${runs[@]}"; do
        i=$((i + 1))
        local -a envs=() rest=()
        local word
        for word in $args; do
            if [ ${#rest[@]} -eq 0 ] && [[ $word =~ ^STRATA_[A-Z_]+= ]]; then envs+=("$word"); else rest+=("$word"); fi
        done
        log "bench-$what-$i" env "${envs[@]}" "$CARRY/strata" bench "$what" --json "$WORK/$what-$i.json" --svg "$WORK/$what-$i.svg" "${rest[@]}" || rc=1
    done
    return $rc
}

step_bench_graph() { bench_runs graph "$GRAPH_RUNS"; }
step_bench_embed() { bench_runs embed "$EMBED_RUNS"; }

run() {
    mkdir -p "$OUT"
    export STRATA_KERNEL_CACHE="${STRATA_KERNEL_CACHE:-$WORK/kernel-cache}"
    export RUST_BACKTRACE=0
    local steps=("$@")
    [ ${#steps[@]} -eq 0 ] && steps=("${STEPS[@]}")
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv >"$WORK/nvidia-smi.txt" 2>&1 || true
    local failed=0
    for s in "${steps[@]}"; do
        "step_${s//-/_}" || failed=1
    done
    publish
    rm -rf "$STRATA_KERNEL_CACHE"
    head -n $((${#SUMMARY[@]} + 1)) "$OUT/workloads.log"
    rm -rf "$WORK"
    return $failed
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 build | run [step...]   (steps: ${STEPS[*]})" >&2; exit 2 ;;
esac
