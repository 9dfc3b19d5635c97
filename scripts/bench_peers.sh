#!/usr/bin/env bash
# Fusebox against Taichi on every case of bench/micro, bench/large and bench/real, and on
# Taichi 1.7's own examples run in place (the shipped suite), in one run, interleaved, with the same thread count; checks that the final fields
# agree and prints two ratio tables with geometric means, wall-clock and
# process CPU time per step (read the CPU one on a loaded machine), with each
# engine's thread count and the load average (bench/peers/README.md).
#
#   bash scripts/bench_peers.sh --quick             # smoke run (1 cycle, 1 + 2 steps)
#   bash scripts/bench_peers.sh --json peers.json   # 3 cycles, the sessions' step counts
#   bash scripts/bench_peers.sh --help              # every option (installs nothing)
#
# Peers are benchmark dependencies only: the first run makes virtual
# environments under $FB_PEERS_DIR (default ~/.cache/fusebox-peers) and
# installs taichi==1.7.* from PyPI into one made with a pyenv (or system)
# Python 3.8-3.12, and, when a Python 3.8 is there, taichi==0.7.* for
# AsyncTaichi (async_mode=True) as a second peer. Nothing of this is needed
# to build or test Fusebox. The fusebox CLI is $FUSEBOX if set, else
# build-rel/client/fusebox (configured and built as Release if missing).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
driver="$root/bench/peers/bench_peers.py"
host_py="$(command -v python3 || true)"
[ -x /usr/bin/python3 ] && host_py=/usr/bin/python3
[ -n "$host_py" ] || { echo "bench_peers.sh: no python3 found" >&2; exit 2; }

no07=0
args=()
for a in "$@"; do
  case "$a" in
    -h|--help)
      sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
      echo "script options: --no-taichi07 (skip the Taichi 0.7 async peer)"
      echo
      exec "$host_py" "$driver" --help ;;
    --no-taichi07) no07=1 ;;
    *) args+=("$a") ;;
  esac
done
# Refuse bad arguments before installing or building anything.
"$host_py" "$driver" --fusebox unused --check-args ${args[@]+"${args[@]}"}

# A Python interpreter whose version is one of $@ (pyenv first, then PATH).
find_python() {
  local v p
  for v in "$@"; do
    for p in "$HOME"/.pyenv/versions/"$v".*/bin/python "$(command -v "python$v" || true)"; do
      [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
    done
  done
  return 1
}

# make_venv DIR PYTHON SPEC: a virtual environment with SPEC installed
# (a marker file records a finished install, so a broken one is redone).
make_venv() {
  local dir="$1" py="$2" spec="$3"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$spec" ]; then return 0; fi
  rm -rf "$dir"
  "$py" -m venv "$dir" || return 1
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$spec" || return 1
  "$dir/bin/python" -c 'import taichi' >/dev/null 2>&1 || return 1
  echo "$spec" > "$dir/.installed"
}

peers_dir="${FB_PEERS_DIR:-$HOME/.cache/fusebox-peers}"
mkdir -p "$peers_dir"
peers=()
py17="$(find_python 3.11 3.10 3.12 3.9 3.8)" || { echo "bench_peers.sh: no Python 3.8-3.12 for Taichi 1.7" >&2; exit 2; }
echo "bench_peers.sh: Taichi 1.7 in $peers_dir/taichi17 (Python: $py17)" >&2
make_venv "$peers_dir/taichi17" "$py17" 'taichi==1.7.*' ||
  { echo "bench_peers.sh: installing taichi==1.7.* failed (PyPI reachable?)" >&2; exit 2; }
peers+=(--peer "taichi-1.7=$peers_dir/taichi17/bin/python")
if [ "$no07" = 0 ]; then
  if py38="$(find_python 3.8)"; then
    echo "bench_peers.sh: Taichi 0.7 (AsyncTaichi) in $peers_dir/taichi07 (Python: $py38)" >&2
    if make_venv "$peers_dir/taichi07" "$py38" 'taichi==0.7.*'; then
      peers+=(--peer "taichi-0.7-async=$peers_dir/taichi07/bin/python:async")
    else
      echo "bench_peers.sh: taichi==0.7.* did not install; running without that peer" >&2
    fi
  else
    echo "bench_peers.sh: no Python 3.8 for Taichi 0.7; running without the AsyncTaichi peer" >&2
  fi
fi

fusebox="${FUSEBOX:-$root/build-rel/client/fusebox}"
if [ ! -x "$fusebox" ]; then
  echo "bench_peers.sh: building $fusebox (Release)" >&2
  cmake -S "$root" -B "$root/build-rel" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$root/build-rel" -j"$(nproc)" --target fusebox fuseboxd >/dev/null
fi
echo "bench_peers.sh: $(uptime)" >&2
exec "$host_py" "$driver" --fusebox "$fusebox" "${peers[@]}" ${args[@]+"${args[@]}"}
