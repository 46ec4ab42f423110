#!/usr/bin/env bash
# scripts/gpu-session.sh: one device call that checks main and measures one workload, within
# the 10-minute limit of a call (built beforehand with `scripts/gpu-check.sh build`, which
# also carries the `strata` binary the workloads use; carry [".carry"]).
#
#   bash scripts/gpu-session.sh [tests] [bfs25] [micro]
#     tests  every GPU test binary (scripts/gpu-check.sh run info gpu_tests)
#     bfs25  BFS on a Kronecker scale-25 graph at 2x, Strata beside zero-copy and UVM
#            (the issue-12 target), at the default dense fraction
#     micro  `strata bench gpu-micro` (scripts/gpu-check.sh run gpu_micro)
#     unified  the unified allocations' GPU tests, then `strata bench unified` (issue 14)
#     gathers  the element-access GPU tests (gpu, remote_access), this machine's ceilings, then
#              gpu-micro's gathers at 1x-8x, one call per ratio
#     readonly  the workloads (whose inputs are read-only spaces): their correctness checks, then
#              BFS and PageRank on a Kronecker scale-25 graph at 2x (Strata, zero-copy, UVM) and
#              512-byte embedding rows at 4x (Strata, zero-copy)
#     subpage  sub-page fetch (issue 12): its GPU tests, the element-access test binaries again with
#              STRATA_GPU_SECTOR=4KiB (their 16-64 KiB pages then load 4 KiB sectors), then
#              gpu-micro with sectors off and on: gathers over 64 KiB pages, random updates and
#              streaming (SUBPAGE_RATIOS, default 2,8); subpage-bench: the gpu-micro part alone;
#              sector-tests: the test part alone
# Logs land in $OUT (the device tool brings them back).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-logs}"
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests bfs25)
for step in "${steps[@]}"; do
    case "$step" in
        tests) GPU_TEST_TIMEOUT="${GPU_TEST_TIMEOUT:-120}" OUT="$OUT" bash "$ROOT/scripts/gpu-check.sh" run info gpu_tests ;;
        micro) OUT="$OUT" bash "$ROOT/scripts/gpu-check.sh" run gpu_micro ;;
        unified)
            (cd "$ROOT" && timeout 240 .carry/tests/strata-unified__gpu --test-threads 1 --nocapture) \
                >"$OUT/unified-tests.log" 2>&1
            echo "unified tests: exit $? ($(grep -c '\.\.\. ok' "$OUT/unified-tests.log") ok)"
            mkdir -p "$OUT/unified"
            timeout 300 "$ROOT/.carry/strata" bench unified --out "$OUT/unified" >"$OUT/unified-bench.log" 2>&1
            echo "unified bench: exit $?"
            ;;
        gathers)
            for t in gpu remote_access; do
                (cd "$ROOT" && timeout 200 ".carry/tests/strata-gpu__$t" --test-threads 1 --nocapture) \
                    >"$OUT/tests-$t.log" 2>&1
                echo "tests $t: exit $? ($(grep -c '\.\.\. ok' "$OUT/tests-$t.log") ok)"
            done
            timeout 180 "$ROOT/.carry/strata" bench ceilings --dir /tmp >"$OUT/ceilings.log" 2>&1
            echo "ceilings: exit $?"
            # One call per ratio, each with its own limit, so a slow ratio costs only itself.
            for r in 1 2 4 8; do
                timeout "${GATHER_TIMEOUT:-75}" "$ROOT/.carry/strata" bench gpu-micro --ratios $r --reps 5 \
                    --skip-uvm --patterns gather-uniform,gather-zipf --out "$OUT/gathers-$r" \
                    >"$OUT/gathers-$r.log" 2>&1
                echo "gathers ${r}x: exit $?"
            done
            ;;
        bfs25)
            mkdir -p "$ROOT/.carry/workloads"
            cp "$ROOT/.carry/strata" "$ROOT/.carry/workloads/strata"
            OUT="$OUT" STEP_TIMEOUT="${STEP_TIMEOUT:-330}" \
                GRAPH_RUNS="--scale 25 --graph-file /tmp/k25.bin --algorithms bfs --oversubscription 2 --reps 3 --modes strata,zero-copy,uvm" \
                bash "$ROOT/scripts/gpu-workloads.sh" run bench-graph
            ;;
        readonly)
            mkdir -p "$ROOT/.carry/workloads"
            cp "$ROOT/.carry/strata" "$ROOT/.carry/workloads/strata"
            OUT="$OUT" STEP_TIMEOUT="${STEP_TIMEOUT:-240}" \
                GRAPH_RUNS="--scale 25 --graph-file /tmp/k25.bin --algorithms bfs,pagerank --oversubscription 2 --reps 3 --modes strata,zero-copy,uvm" \
                EMBED_RUNS="--dim 128 --modes strata,zero-copy" \
                bash "$ROOT/scripts/gpu-workloads.sh" run check bench-graph bench-embed
            ;;
        subpage|subpage-bench|sector-tests)
            [ "$step" != subpage-bench ] && for t in sub_page; do
                (cd "$ROOT" && timeout 240 ".carry/tests/strata-gpu__$t" --test-threads 1 --nocapture) \
                    >"$OUT/tests-$t.log" 2>&1
                echo "tests $t: exit $? ($(grep -c '\.\.\. ok' "$OUT/tests-$t.log") ok)"
            done
            [ "$step" != subpage-bench ] && for t in remote_access gpu trust write_back; do
                (cd "$ROOT" && STRATA_GPU_SECTOR=4KiB timeout 200 ".carry/tests/strata-gpu__$t" --test-threads 1 --nocapture) \
                    >"$OUT/tests-sector-$t.log" 2>&1
                echo "tests $t with 4 KiB sectors: exit $? ($(grep -c '\.\.\. ok' "$OUT/tests-sector-$t.log") ok)"
            done
            [ "$step" != sector-tests ] && for sector in off 4KiB; do
                for remote in auto off; do
                    timeout "${SUBPAGE_TIMEOUT:-100}" "$ROOT/.carry/strata" bench gpu-micro --no-ceilings --skip-uvm \
                        --ratios "${SUBPAGE_RATIOS:-2,8}" --reps 3 --gather-page 64KiB --sector $sector --remote-access $remote \
                        --patterns gather-uniform,gather-zipf,rmw-random-64k,stream-read \
                        --out "$OUT/subpage-$sector-$remote" >"$OUT/subpage-$sector-$remote.log" 2>&1
                    echo "gpu-micro sector $sector remote $remote: exit $?"
                done
            done
            ;;
        *) echo "unknown step $step (tests, bfs25, micro, unified, gathers, readonly, subpage, subpage-bench, sector-tests)" >&2; exit 2 ;;
    esac
done
