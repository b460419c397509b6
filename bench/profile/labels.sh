#!/bin/sh
# bench/profile/labels.sh [ROUNDS] [BASE] - what the route and VM state
# labels add to a safe-point sample: this tree against BASE (a commit
# before the labels, 7e4314f by default), built side by side in a
# temporary worktree, each running bench/profile/labels.lua (the same
# script, the same workload) in turn, the order alternating by round.
# Per sample, medians over the rounds:
#   drain    the drains' CPU / samples (the Lua side: a label per distinct
#            sample, the requests' samples waiting for their route)
#   capture  the capture's mean (the C side: the thread's exdata noted)
#   route    request_done's CPU / samples (this tree only: each request
#            gives its route to its records; per request too)
# The labels' cost per sample is (drain + capture + route) here minus
# (drain + capture) in BASE.
set -eu
cd "$(dirname "$0")/../.."
ROUNDS=${1:-9}
BASE=${2:-7e4314f}
HZ=${PE_BENCH_HZ:-9999}
T=$(mktemp -d /tmp/pe-bench-labels.XXXXXX)
trap 'git worktree remove --force "$T/base" >/dev/null 2>&1 || true; rm -rf "$T"' EXIT INT TERM
git worktree add --detach -q "$T/base" "$BASE"
make -C "$T/base" -s -j2 >/dev/null
[ -f build/perf_event/core.so ] || make -s -j2 >/dev/null
export PE_BENCH_WORKLOAD="$PWD/bench/profile/workload.lua"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="head base"; else order="base head"; fi
  for t in $order; do
    if [ "$t" = base ]; then dir="$T/base"; else dir=.; fi
    (cd "$dir" && luajit "$OLDPWD/bench/profile/labels.lua" "$HZ") | sed "s/^/$t /" >> "$T/out"
  done
done
awk -v rounds="$ROUNDS" -v hz="$HZ" -v base="$BASE" '
  function median(list,   a, n, x, y, t) {
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  # tree, samples, drain s, capture ns, route s, requests, routed
  { d[$1] = d[$1] " " 1e6 * $3 / $2; c[$1] = c[$1] " " $4 / 1e3; rt[$1] = rt[$1] " " 1e6 * $5 / $2
    pr[$1] = pr[$1] " " 1e6 * $5 / $6; n[$1] = n[$1] " " $2; routed[$1] = $7 }
  END {
    printf "%d rounds at %d Hz, this tree against %s (us a sample, medians)\n", rounds, hz, base
    for (t in d) printf "%-5s samples %6.0f  drain %.3f  capture %.3f  route %.3f (%.3f a request)  routes given: %s\n",
      t, median(n[t]), median(d[t]), median(c[t]), median(rt[t]), median(pr[t]), routed[t]
    printf "labels: %+.3f us a sample\n", median(d["head"]) + median(c["head"]) + median(rt["head"]) - median(d["base"]) - median(c["base"])
  }' "$T/out"
