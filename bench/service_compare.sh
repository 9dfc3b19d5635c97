#!/usr/bin/env bash
# Two builds of fuseboxd compared on service_bench (issue 41's targets: the
# pipelined launch rate and the sync round trip), interleaved so that both
# see the same machine: each round runs OLD then NEW under thread isolation,
# then OLD then NEW under process isolation, each with its own fuseboxd and
# its own service_bench, and the table gives the median of the rounds and
# NEW/OLD.
#   bench/service_compare.sh OLD_BUILD NEW_BUILD [ROUNDS]
# OLD_BUILD and NEW_BUILD are Release build directories (each with
# bench/service_bench and server/fuseboxd); ROUNDS defaults to 5. The
# figures are those of service_bench --launches 200000 --syncs 1000
# --mib 16 (FB_COMPARE_ARGS replaces these). A round of both builds and
# both modes takes some 30-60 s on a quiet machine.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bench/service_compare.sh OLD_BUILD NEW_BUILD [ROUNDS]" >&2
  exit 2
fi
OLD=$1 NEW=$2 ROUNDS=${3:-5}
ARGS=${FB_COMPARE_ARGS:---launches 200000 --syncs 1000 --mib 16}
for b in "$OLD" "$NEW"; do
  for f in bench/service_bench server/fuseboxd; do
    [ -x "$b/$f" ] || { echo "service_compare.sh: no $b/$f" >&2; exit 2; }
  done
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# one run: its launch rate and sync median (us) appended to FILE
run() { # BUILD ISOLATION FILE
  local t
  # shellcheck disable=SC2086 # ARGS is a list of arguments
  t=$("$1/bench/service_bench" --fuseboxd "$1/server/fuseboxd" --isolation "$2" $ARGS --repeat 1)
  awk '/^launches\/s \(pipelined\)/ {r = $NF} /^sync round trip median/ {m = $(NF-1)}
       END {if (r == "" || m == "") exit 1; print r, m}' <<<"$t" >>"$3"
}
for ((i = 1; i <= ROUNDS; i++)); do
  for iso in thread process; do
    run "$OLD" "$iso" "$out/old-$iso"
    run "$NEW" "$iso" "$out/new-$iso"
  done
  echo "round $i of $ROUNDS done" >&2
done
median() { # FILE COLUMN
  sort -g -k"$2,$2" "$1" | awk -v c="$2" '{v[NR] = $c} END {
    if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
printf '%-34s %14s %14s %7s\n' "median of $ROUNDS (service_bench)" old new new/old
for iso in thread process; do
  for col in 1 2; do
    o=$(median "$out/old-$iso" $col) n=$(median "$out/new-$iso" $col)
    what=$([ $col = 1 ] && echo "launches/s, $iso" || echo "sync round trip us, $iso")
    printf '%-34s %14s %14s %7.2f\n' "$what" "$o" "$n" "$(awk -v a="$n" -v b="$o" 'BEGIN {print a / b}')"
  done
done
echo "(OLD $OLD, NEW $NEW; service_bench $ARGS)"
