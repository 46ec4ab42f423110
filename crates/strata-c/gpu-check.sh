#!/usr/bin/env bash
# Checks libstrata and the strata Python package on a GPU machine (the parts CI cannot run):
# the C API test's GPU branch, the nvcc example through its Makefile and through CMake with the
# installed pkg-config/CMake files, pytest including the GPU round trip, kernel launch and
# strata.torch.EmbeddingBag (against the machine's PyTorch), then the EmbeddingBag benchmark.
#
#   crates/strata-c/gpu-check.sh build     # here: release libstrata.so + wheel into .carry-py/
#   crates/strata-c/gpu-check.sh run       # there (nvcc, numpy, torch, pytest, NVRTC present)
#   crates/strata-c/gpu-check.sh run py    # there: only the Python package (pytest, benchmark)
#
# The benchmark writes embedding_bag.json/.png and its log under $BENCH_OUT (default $OUT, else
# a temporary directory); EMBAG_BENCH=0 skips it, EMBAG_BENCH_ARGS passes it options;
# PYTEST_TIMEOUT and BENCH_TIMEOUT (seconds) bound the two steps.
set -u -o pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
carry="$root/.carry-py"
case "${1:-}" in
build)
    set -e
    cd "$root"
    cargo build --release -p strata-c
    mkdir -p "$carry"
    cp target/release/libstrata.so "$carry/" && strip "$carry/libstrata.so"
    python3 -m pip install -q 'maturin>=1.9,<2'
    rm -f "$carry"/strata-*.whl
    maturin build --release --manifest-path crates/strata-py/Cargo.toml --out "$carry"
    ls -la "$carry"
    ;;
run)
    cd "$root"
    nvrtc=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
    export LD_LIBRARY_PATH="$nvrtc:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    prefix=$(mktemp -d)/prefix
    work=$(mktemp -d)
    status=0
    step() { echo "== $1"; shift; "$@" || { echo "FAILED: $*"; status=1; }; }
    if [ "${2:-all}" != py ]; then
        step install bash crates/strata-c/install.sh "$prefix" "$carry"
        export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
        # shellcheck disable=SC2046 # pkg-config prints several flags
        step "C api_test (build)" gcc -std=c11 -Wall -Wextra -Werror -O1 -o "$work/api_test" \
            crates/strata-c/tests/c/api_test.c $(pkg-config --cflags --libs strata)
        step "C api_test (GPU branch)" timeout 120 "$work/api_test" "$RANDOM$RANDOM" "$work"
        step "nvcc example (Makefile)" make -C examples/gpu-space STRATA_PREFIX="$prefix" ARCH=sm_90
        step "nvcc example (run)" timeout 300 examples/gpu-space/scale 64
        step "nvcc example (CMake configure)" cmake -S examples/gpu-space -B "$work/build" \
            -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CUDA_ARCHITECTURES=90
        step "nvcc example (CMake build)" cmake --build "$work/build"
        step "nvcc example (CMake run)" timeout 300 "$work/build/scale" 16
    fi
    # The machine's python3 may itself be a virtual environment (PyTorch's), so the package and
    # any carried test wheels go to a --target directory on PYTHONPATH, not into a new venv.
    site="$work/site"
    if [ -d "$carry/deps" ]; then
        step "test deps" python3 -m pip install -q --no-deps --no-index --target "$site" "$carry"/deps/*.whl
    fi
    step "wheel" python3 -m pip install -q --no-deps --no-index --target "$site" "$carry"/strata-*.whl
    # Each subshell exits with its step's status (step itself always returns 0).
    (cd "$work" && export PYTHONPATH="$site" && step pytest timeout "${PYTEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider \
        -rs "$root/crates/strata-py/tests"; exit $status) || status=1
    if [ "${EMBAG_BENCH:-1}" != 0 ]; then
        bench_out="${BENCH_OUT:-${OUT:-$work/bench}}"
        mkdir -p "$bench_out"
        # shellcheck disable=SC2086 # EMBAG_BENCH_ARGS holds several options
        (export PYTHONPATH="$site" PYTHONUNBUFFERED=1 && step "EmbeddingBag benchmark" timeout "${BENCH_TIMEOUT:-480}" \
            python3 "$root/crates/strata-py/bench/embedding_bag.py" --out "$bench_out" ${EMBAG_BENCH_ARGS:-}
            exit $status) 2>&1 | tee "$bench_out/bench.log" || status=1
    fi
    exit $status
    ;;
*)
    echo "usage: gpu-check.sh build|run" >&2
    exit 2
    ;;
esac
