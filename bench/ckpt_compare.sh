#!/usr/bin/env bash
# Checkpoint and restore of a 1 GiB session, before against after, interleaved
# (bench/RESULTS.md, "Checkpoint and restore of a 1 GiB session"): the
# engine (ckpt_bench) and through fuseboxd (ckpt_service_bench.py, process
# and thread isolation), ROUNDS rounds (default 3) of one run of each build
# in turn, base first. Each build directory is a Release build of its
# commit (cmake -DCMAKE_BUILD_TYPE=Release; targets ckpt_bench, fuseboxd).
# The Python client and the service bench are this checkout's for both.
# About 6 minutes on a quiet 2-core machine; the table of medians is
# bench/ckpt_compare.py's, run on the logs at the end.
#
#   bench/ckpt_compare.sh BASE_BUILD NEW_BUILD [ROUNDS] [MIB]
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bench/ckpt_compare.sh BASE_BUILD NEW_BUILD [ROUNDS] [MIB]" >&2
  exit 2
fi
base=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
rounds=${3:-3}
mib=${4:-1024}
here=$(cd "$(dirname "$0")" && pwd)
for b in "$base" "$new"; do
  for t in bench/ckpt_bench server/fuseboxd; do
    [ -x "$b/$t" ] || { echo "ckpt_compare: $b/$t is missing (build it)" >&2; exit 2; }
  done
done
dir=${CKPT_DIR:-/dev/shm}
py=${PYTHON:-/usr/bin/python3} # with grpcio (the Python client)
logs=$(mktemp -d "${TMPDIR:-/tmp}/ckpt_compare.XXXXXX")
# the Python client, built (its protocol stubs) as python/tests/conftest.py builds it
(cd "$here/../python" && "$py" setup.py -q build_py --build-lib "$logs/pylib" >/dev/null)
echo "logs in $logs; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  for side in base new; do
    b=$base
    [ "$side" = new ] && b=$new
    "$b/bench/ckpt_bench" --mib "$mib" --repeat 1 --dir "$dir" >"$logs/engine.$side.$r" 2>&1
    for iso in process thread; do
      PYTHONPATH="$logs/pylib" "$py" "$here/ckpt_service_bench.py" --fuseboxd \
        "$b/server/fuseboxd" --mib "$mib" --repeat 1 --dir "$dir" --isolation "$iso" \
        >"$logs/service-$iso.$side.$r" 2>&1
    done
    echo "round $r $side done (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
python3 "$here/ckpt_compare.py" "$logs"
