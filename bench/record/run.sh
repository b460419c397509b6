#!/bin/sh
# bench/record/run.sh [ITERS [ROUNDS]] - end-to-end call-graph profiling of
# one workload (build/test/petarget spin ITERS, ~1-2 s) by the two tools, in
# the same run, round by round:
#   perf:    perf record -g -F 999 -o F.data -- CMD  +  perf script -i F.data
#   luaperf: bin/luaperf record -g -F 999 -o F.folded -- CMD
# Prints each round's wall times and the median ratio luaperf / perf (issue
# 13: <= 0.5).  Wall time of the whole pipeline, workload included, as a
# user waits for it; the workload is the same binary and arguments.
set -e
cd "$(dirname "$0")/../.."
iters=${1:-300000000}
rounds=${2:-5}
make -s all fixtures >/dev/null
command -v perf >/dev/null || { echo "bench/record: perf is not installed"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
: > "$tmp/ratios"
i=1
while [ "$i" -le "$rounds" ]; do
  t0=$(now)
  perf record -q -g -F 999 -o "$tmp/p.data" -- build/test/petarget spin "$iters" >/dev/null 2>&1
  perf script -i "$tmp/p.data" > "$tmp/p.script" 2>/dev/null
  t1=$(now)
  luajit bin/luaperf record -g -F 999 -o "$tmp/l.folded" -- build/test/petarget spin "$iters" \
    >/dev/null 2>"$tmp/l.err"
  t2=$(now)
  awk -v a="$t0" -v b="$t1" -v c="$t2" -v i="$i" -v f="$tmp/ratios" 'BEGIN {
    p = b - a; l = c - b
    printf "round %d: perf record+script %.3f s, luaperf record %.3f s, ratio %.3f\n", i, p, l, l / p
    printf "%.4f\n", l / p >> f }'
  i=$((i + 1))
done
samples=$(sed -n 's/.*luaperf record: \([0-9]*\) samples.*/\1/p' "$tmp/l.err")
echo "luaperf's last round: ${samples:-?} samples; perf script's: $(grep -c 'cycles\|cpu-clock' "$tmp/p.script" || true) sample lines"
sort -n "$tmp/ratios" | awk '{ r[NR] = $1 } END { printf "median ratio luaperf / perf: %.3f (goal <= 0.5), over %d rounds\n", r[int((NR + 1) / 2)], NR }'
