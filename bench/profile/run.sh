#!/bin/sh
# bench/profile/run.sh [ROUNDS] [SECONDS] - bench/profile/overhead.lua on
# LuaJIT, Lua 5.4 and Lua 5.1 (each with its own core under build/), one
# process each. PE_BENCH_LUAS="luajit" picks interpreters.
#
# PE_BENCH_CALLGRIND=1 adds the per-sample cost in instructions, counted by
# valgrind --tool=callgrind (no timer noise): for each interpreter and
# profiled mode, four runs of `overhead.lua --once` (no profile and the mode,
# each at two workload sizes N1 < N2); the fixed costs (start, stop, the
# self-tests, loading) cancel in the differences, so
#   Ir/sample = ((Ir(mode,N2) - Ir(mode,N1)) - (Ir(none,N2) - Ir(none,N1)))
#               / (samples(mode,N2) - samples(mode,N1))
# and "armed", a profile with one sample per 100 s (none in the run), gives
#   armed = (Ir(armed,N2) - Ir(armed,N1)) / (Ir(none,N2) - Ir(none,N1)) - 1
# what an armed profile costs the work itself (LuaJIT's line checks). (At
# 1 Hz the N2 run would take a sample, whose capture, drain and naming
# would count as the work's: that made "armed" +0.4..+8 %.)
# On LuaJIT the traces a run compiles differ a little from run to run: the
# counts move by about 1 % (2 % seen), which is ~2k Ir per sample at 999 Hz.
# Under valgrind the code runs ~30x slower, so a cpu-clock profile takes ~30x
# the samples per unit of work; the figure is what one sample costs, not the
# share of a native run.
cd "$(dirname "$0")/../.." || exit 2
rounds=${1:-15}
secs=${2:-0.2}
luas=${PE_BENCH_LUAS:-"luajit lua5.4 lua5.1"}
rc=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The floor (bench/profile/floor.c): what a sample costs on this machine
# before any profiler code runs, on a C loop at 9999 Hz: the kernel's side
# (timer interrupt, the sample written) and the signal's delivery, as
# sigtrap sends it (the default) and as the fd's F_SETSIG after a wakeup
# per sample (the fallback); and, for comparison, a POSIX timer of the same
# rate with its signal and no perf event at all.
# floor_run LABEL ITERS [KB]: 7 rounds of the five modes, medians
floor_run() {
  : > "$tmp/floor.out"
  r=1
  while [ "$r" -le 7 ]; do
    for m in 0 1 2 3 4; do "$tmp/floor" "$m" "$2" 9999 ${3:-} || rc=1; done >> "$tmp/floor.out"
    r=$((r + 1))
  done
  sort -n -k1,1 -k2,2 "$tmp/floor.out" | awk -v label="$1" '
    { t[$1] = t[$1] " " $2; s[$1] = s[$1] " " $3 }
    function med(list,   a, n) { n = split(list, a, " "); return a[int((n + 1) / 2)] }
    END {
      n1 = med(s[1]); n2 = med(s[2]); n3 = med(s[3]); n4 = med(s[4])
      k = n1 > 0 ? (med(t[1]) - med(t[0])) / n1 * 1e6 : 0
      g = n2 > 0 ? (med(t[2]) - med(t[1])) / n2 * 1e6 : 0
      q = n3 > 0 ? (med(t[3]) - med(t[1])) / n3 * 1e6 : 0
      x = n4 > 0 ? (med(t[4]) - med(t[0])) / n4 * 1e6 : 0
      printf "floor (%s, cpu-clock 9999 Hz, 7 rounds, medians): kernel side %.1f us/sample; the signal: sigtrap %.1f us, F_SETSIG with a wakeup %.1f us\n", label, k, q, g
      printf "  so before any profiler code, sigtrap: %.2f %% of CPU at 999 Hz, %.3f %% at 99 Hz", (k + q) * 999 / 1e4, (k + q) * 99 / 1e4
      printf "; F_SETSIG: %.2f %%, %.3f %%\n", (k + g) * 999 / 1e4, (k + g) * 99 / 1e4
      printf "  a POSIX timer (CLOCK_MONOTONIC, no perf event) and its signal: %.1f us a tick, %.2f %% at 999 Hz\n", x, x * 999 / 1e4
    }'
}
if cc -std=gnu11 -O2 -o "$tmp/floor" bench/profile/floor.c 2>"$tmp/cc.err"; then
  floor_run "C loop" 300000000
  # the same loop reading a 1 MiB buffer a cache line an iteration: the
  # caches an interrupt disturbs cost the interrupted code too
  floor_run "C loop over 1 MiB" 100000000 1024
  echo
else
  echo "floor: no C compiler ($(cat "$tmp/cc.err"))"
fi

for l in $luas; do
  $l bench/profile/overhead.lua "$rounds" "$secs" || rc=1
  echo
done
[ "${PE_BENCH_CALLGRIND:-0}" = 1 ] || exit $rc

n1=${PE_BENCH_N1:-100}
n2=${PE_BENCH_N2:-300}
# one run under callgrind: prints "instructions samples"
cg() {
  valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file=/dev/null \
    --log-file="$tmp/log" "$1" bench/profile/overhead.lua --once "$2" "$3" > "$tmp/out" || return 1
  ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/log")
  ns=$(sed -n 's/.* samples \([0-9]*\)$/\1/p' "$tmp/out")
  echo "${ir:-0} ${ns:-0}"
}
echo "callgrind: instructions per sample (workload sizes $n1 and $n2)"
for l in $luas; do
  # (no jit.profile row: its SIGPROF timer ends the process under valgrind)
  if ! a=$(cg "$l" none "$n1") || ! b=$(cg "$l" none "$n2"); then echo "$l: valgrind failed"; rc=1; continue; fi
  # armed, no sample in the run: what the profile costs the work
  # itself (on LuaJIT, the traces' line checks; LuaJIT's traces differ from
  # run to run by about 1 % of these counts, so this is a sign only)
  # (pearmf: the same with lj_mode "f", no line checks; LuaJIT only)
  arm="pearm"
  [ "$l" = luajit ] && arm="pearm pearmf"
  for m in $arm; do
    if ! c=$(cg "$l" "$m" "$n1") || ! d=$(cg "$l" "$m" "$n2"); then echo "$l $m: valgrind failed"; rc=1; continue; fi
    echo "$a $b $c $d" | awk -v l="$l" -v m="$m" '{
      printf "%-7s %-8s %+.2f %% instructions per unit of work (armed, %d samples)\n",
             l, m == "pearm" ? "armed" : "armed f", (($7 - $5) / ($3 - $1) - 1) * 100, $8 }'
  done
  ms="pe999 pe99"
  [ "$l" = luajit ] && ms="pe999 pe99 pe99f"
  for m in $ms; do
    if ! e=$(cg "$l" "$m" "$n1") || ! f=$(cg "$l" "$m" "$n2"); then echo "$l $m: valgrind failed"; rc=1; continue; fi
    echo "$a $b $e $f" | awk -v l="$l" -v m="$m" '{
      dn = $3 - $1; dp = $7 - $5; ds = $8 - $6
      if (ds <= 0) { printf "%-7s %-8s no samples\n", l, m; next }
      printf "%-7s %-8s %10.0f Ir/sample (%d samples more; workload %.0f -> %.0f Mi Ir)\n",
             l, m, (dp - dn) / ds, ds, $1 / 1048576, $3 / 1048576 }'
  done
done
exit $rc
