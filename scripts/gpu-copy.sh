#!/usr/bin/env bash
# scripts/gpu-copy.sh: checks and measures strata-copy (small CPU<->GPU copies) on a GPU.
#
#   scripts/gpu-copy.sh build [DIR]   # here (no GPU needed): release binaries into DIR
#                                     # (default .carry-copy/ of this checkout)
#   bash DIR/gpu-copy.sh run          # on the GPU machine: tests, C program, `strata bench copy`
#
# `run` writes $OUT/gpu-copy.log (every step's output and a summary) plus copy-bench.json and
# copy-bench.svg. Every step has a time limit, so a hung GPU never hangs the run.
set -u -o pipefail

build() {
    set -e
    local root dir target
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    dir="${1:-$root/.carry-copy}"
    target="${CARGO_TARGET_DIR:-$root/target}"
    mkdir -p "$dir"
    cd "$root"
    cargo build --release -p strata-cli
    cp "$target/release/strata" "$dir/strata"
    cargo test --release -p strata-copy -p strata-gdr --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"], m["executable"])' |
        while read -r name exe; do cp "$exe" "$dir/test_$name"; done
    cargo build --release -p strata-gdr
    cp "$target/release/libstrata_gdr.so" "$dir/"
    cc -std=c11 -Wall -Wextra -Werror -O2 -I crates/strata-copy/gdr/include \
        crates/strata-copy/gdr/tests/gdr_program.c -o "$dir/gdr_program" \
        -L "$dir" -Wl,-rpath,'$ORIGIN' -lstrata_gdr -ldl
    cp scripts/gpu-copy.sh "$dir/"
    strip --strip-debug "$dir/strata" "$dir"/test_* "$dir/libstrata_gdr.so"
    ls -la "$dir"
    du -sh "$dir"
}

run() {
    local here out log
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    out="${OUT:-$PWD/gpu-logs}"
    mkdir -p "$out"
    log="$out/gpu-copy.log"
    : >"$log"
    local nvrtc
    # NVRTC from the nvidia-cuda-nvrtc wheel, wherever its lib directory is.
    nvrtc=$(python3 -c 'import nvidia, glob, os; print(next(iter(sorted(os.path.dirname(p) for p in glob.glob(os.path.join(list(nvidia.__path__)[0], "**", "libnvrtc.so*"), recursive=True))), ""))' 2>/dev/null || true)
    if [ -n "$nvrtc" ] && [ -d "$nvrtc" ]; then
        export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    local summary=()
    step() { # step <name> <seconds> <command...>
        local name="$1" limit="$2"
        shift 2
        echo "=== $name: $*" >>"$log"
        local start rc
        start=$(date +%s%N)
        timeout -k 10 "$limit" "$@" >>"$log" 2>&1
        rc=$?
        summary+=("$(printf '%-28s rc=%-4s %6d ms' "$name" "$rc" $((($(date +%s%N) - start) / 1000000)))")
    }
    step nvidia-smi 30 nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
    step lscpu 10 sh -c 'lscpu | grep -E "Model name|^CPU\(s\)|NUMA node"'
    step info 60 "$here/strata" info
    step test-ring-emulated 30 "$here/test_ring_emulated"
    step test-nvrtc 30 "$here/test_nvrtc"
    step test-gpu-sanity 100 "$here/test_gpu_sanity" --test-threads=1 --nocapture
    step test-shadow-fault 30 "$here/test_c_api" --exact direct_access_to_a_shadow_faults_loudly
    step gdr-program 40 "$here/gdr_program" "$RANDOM$RANDOM"
    step bench-copy 130 "$here/strata" bench copy --json "$out/copy-bench.json"
    {
        echo "=== summary"
        printf '%s\n' "${summary[@]}"
    } >>"$log"
    cat "$log"
}

case "${1:-}" in
build) shift; build "$@" ;;
run) shift; run "$@" ;;
*) echo "usage: $0 build [DIR] | run" >&2; exit 2 ;;
esac
