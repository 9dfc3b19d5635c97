#!/usr/bin/env bash
# The one command to run first on a GPU machine (docs/gpu.md, "Checking it
# on a GPU"): from the unpacked bundle (scripts/gpu_bundle.sh) or a Release
# build (FB_BUILD_DIR=build-rel), within 8 minutes:
#
#   bash fusebox-gpu/scripts/gpu_check.sh OUTDIR [--fake] [--budget S] [--only STEP,...] [--logs DIR]
#
# Runs the CUDA half of the test suites, the differential tester on CUDA,
# every example in sync and async mode through the bundle's fuseboxd,
# bench/micro, bench/large/gpu and (time allowing) bench/real/gpu, and
# gpu_launch_bench, each step under its own time limit, and writes
# OUTDIR/gpu_check.md and OUTDIR/gpu_check.json (device, driver, commit,
# every figure, every failure with the end of its log). Progress goes to
# stdout. Exit status 0 when every step that ran passed, 1 otherwise; the two
# files are written in every case. --fake runs the steps that make sense
# against the bundle's fake CUDA driver (tests/fakecuda: it runs no kernel),
# which is how CI tests the bundle (scripts/gpu_bundle_test.sh). The work is
# done by gpu_check.py beside this file, with Python's standard library only.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-}
if [ -z "$out" ] || [ "$out" = -h ] || [ "$out" = --help ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  [ -n "$out" ] && exit 0
  exit 2
fi
py=""
for p in python3 python3.12 python3.11 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  # Still leave both files behind, saying why nothing ran.
  mkdir -p "$out"
  msg="no Python 3.8 or newer on PATH: gpu_check.py could not run"
  printf '# Fusebox GPU check\n\n**Nothing ran:** %s.\n' "$msg" >"$out/gpu_check.md"
  printf '{"ok": false, "failures": [{"step": "start", "message": "%s"}], "steps": []}\n' "$msg" \
    >"$out/gpu_check.json"
  echo "gpu_check: $msg" >&2
  exit 1
fi
exec "$py" -u "$here/gpu_check.py" "$@"
