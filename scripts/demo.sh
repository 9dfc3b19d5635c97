#!/usr/bin/env bash
# Install dependencies, build Fusebox (optimized), and run the main job: the
# benchmark programs, on the CPU when there is no GPU. Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${FB_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
"$BUILD"/bench/engine_bench
