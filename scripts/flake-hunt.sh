#!/usr/bin/env bash
# Hunts flaky tests: runs every test binary of the workspace ROUNDS times, in shuffled order,
# by WORKERS workers at once (default 2), so that each suite runs beside another one, a
# harsher load than CI's one binary at a time. Each binary runs from its crate's directory, as
# `cargo test` runs it. Prints one line per failure and keeps its output under OUT.
#
#   scripts/flake-hunt.sh [ROUNDS] [WORKERS] [OUT]      (defaults: 4, 2, /tmp/strata-flakes)
#
# Failures of the UCX tests while another worker runs `strata-net`'s `remote` binary can be
# the namespace test's interfaces coming and going (it holds a lock only its own binary
# honours); read the output before blaming the test that failed.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4}
workers=${2:-2}
out=${3:-/tmp/strata-flakes}
mkdir -p "$out"
export CI="${CI:-true}"

# NVRTC from PyPI, as .ci/run installs it (the tests that compile device code need it).
if nvrtc_dir=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null); then
  export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

list="$out/binaries.txt"
cargo test --workspace --locked --no-run --message-format=json 2>/dev/null | python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"], os.path.dirname(m["manifest_path"]))
' > "$list"
echo "$(wc -l < "$list") test binaries, $rounds rounds, $workers workers; results in $out"

hunt() {
  local id=$1
  for round in $(seq 1 "$rounds"); do
    shuf "$list" | while read -r name exe dir; do
      local log="$out/run-$id.log"
      echo "$round $name" >> "$out/runs-$id.txt"
      if ! (cd "$dir" && timeout 900 "$exe" -q > "$log" 2>&1); then
        local kept="$out/fail-$round-$id-$name-$(basename "$exe").log"
        cp "$log" "$kept"
        echo "FAILED: $name (round $round, worker $id): $kept"
      fi
    done
  done
}

rm -f "$out"/runs-*.txt
for id in $(seq 1 "$workers"); do
  hunt "$id" &
done
wait
echo "done: $(cat "$out"/runs-*.txt | wc -l) runs, $(find "$out" -name 'fail-*' | wc -l) failure(s) kept in $out"
