#!/usr/bin/env bash
# Install dependencies, build Fusebox (optimized), and run the main job on
# the CPU when there is no GPU: the engine benchmark, then every example
# session with its checks. Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${FB_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
echo "== engine benchmark (bench/engine_bench.c)"
"$BUILD"/bench/engine_bench
echo "== example sessions (examples/*.json)"
status=0
for s in examples/*.json; do
  "$BUILD"/client/fusebox run "$s" | tail -n 1 || status=1
done
exit $status
