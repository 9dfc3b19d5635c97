#!/usr/bin/env bash
# Install dependencies, build Fusebox (optimized), and run the main job on
# the CPU when there is no GPU: every example session (on a private
# fuseboxd), then the microbenchmark suite in every engine mode with the
# table of each mode's ratio to sync. Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${FB_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
echo "== example sessions (examples/*.json)"
for s in examples/*.json; do
  "$BUILD"/client/fusebox run "$s" -o "$BUILD"/examples-out | tail -n 1
done
echo "(pictures of examples/wave.json: $BUILD/examples-out/wave_*.png)"
echo "== microbenchmarks (bench/micro/*.json): sync vs async and each pass switched off"
"$BUILD"/client/fusebox bench bench/micro/*.json --json "$BUILD"/micro.json
echo "(machine-readable results in $BUILD/micro.json; the large cases: fusebox bench bench/large/*.json)"
