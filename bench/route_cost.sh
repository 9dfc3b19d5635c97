#!/bin/sh
# The routing key's cost on service_bench (issue 39, target <= 1%), in one
# binary: rounds of `service_bench --route-key on` and `--route-key off`
# interleaved (the order flips every round), each against a private
# fuseboxd with sessions as threads on a unix socket; prints each run's
# pipelined launch rate and sync round-trip median, then the medians and
# the ratios off/on. The key is the client's "fusebox-route" header, sent
# once per call (the Session stream is one call), as is the server's
# "fusebox-replica" header.
#
# usage: bench/route_cost.sh BUILD [ROUNDS]
#   BUILD   a build directory (Release for figures) holding bench/service_bench
#   ROUNDS  on/off pairs (default 8; about 10 s a pair here)
# Environment: LAUNCHES (default 500000), SYNCS (default 3000).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 BUILD [ROUNDS]" >&2; exit 2; }
sb="$1/bench/service_bench"
rounds="${2:-8}"
[ -x "$sb" ] || { echo "$0: no $sb (build the bench target)" >&2; exit 2; }
case "$rounds" in ''|*[!0-9]*) echo "$0: ROUNDS must be a number" >&2; exit 2;; esac
out=$(mktemp /tmp/route-cost-XXXXXX)
trap 'rm -f "$out"' EXIT
i=0
while [ "$i" -lt "$rounds" ]; do
  if [ $((i % 2)) -eq 0 ]; then order="on off"; else order="off on"; fi
  for k in $order; do
    "$sb" --isolation thread --unix --launches "${LAUNCHES:-500000}" --syncs "${SYNCS:-3000}" \
      --mib 1 --repeat 3 --route-key "$k" 2>/dev/null |
      awk -v k="$k" '/^launches\/s/ {r = $NF} /^sync round trip median/ {m = $(NF-1)}
                     END {if (r == "" || m == "") exit 1; print k, r, m}' >>"$out" ||
      { echo "$0: service_bench --route-key $k failed" >&2; exit 1; }
  done
  i=$((i + 1))
done
awk '{printf "%-4s %12.0f launches/s %9.1f us sync\n", $1, $2, $3}' "$out"
sort -k1,1 -k2,2n "$out" | awk '
  function med(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  { if ($1 == "on") ron[++non] = $2; else roff[++noff] = $2 }
  END { lon = med(ron, non); loff = med(roff, noff); print "launch", lon, loff }' >"$out.l"
sort -k1,1 -k3,3n "$out" | awk '
  function med(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  { if ($1 == "on") son[++non] = $3; else soff[++noff] = $3 }
  END { print "sync", med(son, non), med(soff, noff) }' >"$out.s"
awk -v n="$rounds" '
  $1 == "launch" { printf "median over %d rounds: launches/s  key on %.0f  off %.0f  on/off %.4f (cost %+.2f%%)\n", n, $2, $3, $2 / $3, (1 - $2 / $3) * 100 }
  $1 == "sync"   { printf "median over %d rounds: sync median key on %.1f us  off %.1f us  on/off %.4f (cost %+.2f%%)\n", n, $2, $3, $2 / $3, ($2 / $3 - 1) * 100 }' \
  "$out.l" "$out.s"
rm -f "$out.l" "$out.s"
