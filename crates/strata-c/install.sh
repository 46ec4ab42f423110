#!/usr/bin/env bash
# Installs libstrata for C, C++ and CUDA programs under PREFIX:
#   PREFIX/lib/libstrata.so, PREFIX/include/{strata.h,strata.cuh,strata/*.cuh},
#   PREFIX/lib/pkgconfig/strata.pc, PREFIX/lib/cmake/Strata/StrataConfig{,Version}.cmake
# Usage: crates/strata-c/install.sh PREFIX [LIBDIR]  (LIBDIR: where libstrata.so was built,
# default target/release; build it first with `cargo build --release -p strata-c`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prefix="${1:?usage: install.sh PREFIX [LIBDIR]}"
libdir="${2:-$root/target/release}"
test -f "$libdir/libstrata.so" || { echo "no libstrata.so in $libdir: run cargo build --release -p strata-c" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
mkdir -p "$prefix/lib/pkgconfig" "$prefix/lib/cmake/Strata" "$prefix/include"
prefix="$(cd "$prefix" && pwd)"
install -m 0755 "$libdir/libstrata.so" "$prefix/lib/libstrata.so"
install -m 0644 "$here/include/strata.h" "$root/crates/strata-gpu/cuda/strata.cuh" "$prefix/include/"
mkdir -p "$prefix/include/strata"
install -m 0644 "$root"/crates/strata-gpu/cuda/strata/*.cuh "$prefix/include/strata/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/strata.pc.in" > "$prefix/lib/pkgconfig/strata.pc"
install -m 0644 "$here/cmake/StrataConfig.cmake" "$prefix/lib/cmake/Strata/"
sed -e "s|@VERSION@|$version|" "$here/cmake/StrataConfigVersion.cmake.in" > "$prefix/lib/cmake/Strata/StrataConfigVersion.cmake"
echo "installed libstrata $version under $prefix"
