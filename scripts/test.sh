#!/usr/bin/env bash
# Install dependencies, build Fusebox with AddressSanitizer + UBSan in a fresh
# directory, and run the tests through ctest.
# Usage: bash scripts/test.sh            every test
#        bash scripts/test.sh --quick    the quick tier only (ctest -L quick,
#                                        docs/testing.md "Tiers")
#        bash scripts/test.sh -L LABEL   one tier or area: quick, slow,
#                                        security, cuda, python, taichi
set -euo pipefail
cd "$(dirname "$0")/.."
LABEL=()
case "${1:-}" in
  "") ;;
  --quick) LABEL=(-L quick) ;;
  -L) [ -n "${2:-}" ] || { echo "scripts/test.sh: -L needs a label (quick, slow, security, cuda, python, taichi)" >&2; exit 2; }
      LABEL=(-L "$2") ;;
  *) echo "scripts/test.sh: unknown argument '$1' (use --quick or -L LABEL)" >&2; exit 2 ;;
esac
bash scripts/deps.sh
BUILD=${FB_BUILD_DIR:-build-test}
rm -rf "$BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DFB_SANITIZE=ON -DFB_WERROR=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" ${LABEL[@]+"${LABEL[@]}"}
