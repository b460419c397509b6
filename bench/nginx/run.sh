#!/bin/sh
# Requests/s of nginx on loopback with wrk, and the worker's CPU time per
# request, for five modes served by ONE nginx worker (so a mode never gets a
# luckier or unluckier fresh process than another):
#   baseline     /hello, answered by Lua, no log phase
#   loglua       /loglua: the same plus an empty log_by_lua (the price of
#                any log-phase Lua, perf or not)
#   counters     /counters: per-request counters, a group read in log_by_lua
#                on every request
#   counters100  /counters100: the same on one request in 100
#   sampler      /hello with the always-on 1 kHz sampler (cpu-clock, ip),
#                drained every 100 ms by a timer, switched on for the run
#   sampler10k   the same at 10 kHz: ten times the sampler's cost, so that
#                cost stands out of the noise (1 kHz costs a tenth of it)
#   lua99        /hello with the always-on Lua-level sampler (pe.profile,
#                keep=false: every sample resolved to Lua frames and folded
#                into per-stack counts by the 100 ms timer) at 99 Hz
#   lua1k        the same at 1 kHz
# Each round runs baseline, mode, baseline, mode, ..., baseline; every mode
# is compared with the mean of the two baseline runs around it, which
# cancels the slow drift of a shared VM.  The median change over the rounds
# is reported.  CPU per request comes from `luaperf stat -p WORKER -e
# task-clock` over each wrk run.
#   bench/nginx/run.sh [SECONDS_PER_RUN] [ROUNDS] [CONNECTIONS]
# Needs: nginx, libnginx-mod-http-lua, wrk; 'make' done.
set -eu
cd "$(dirname "$0")/../.."
DUR=${1:-3}
ROUNDS=${2:-7}
CONNS=${3:-16}
PORT=${PE_BENCH_PORT:-28099}
. bench/nginx/lib.sh
bench_needs

T=$(mktemp -d /tmp/pe-bench.XXXXXX)
trap 'nginx_stop "$T"; rm -rf "$T"' EXIT INT TERM
bench_tree "$T"
mkdir -p "$T/conf" "$T/logs"
cp bench/nginx/perfreq.lua "$T/lua/"
chmod -R a+rX "$T"

# With 2+ CPUs the worker runs on CPU 1 and wrk on CPU 0, so the two do not
# take turns on one CPU (the largest source of noise on a small VM).
if [ "$(nproc)" -ge 2 ]; then PIN=''; WRK="taskset -c 0 wrk"; else PIN='#'; WRK=wrk; fi

sed -e "s|@LUA_PATH@|$T/lua/?.lua;$T/lua/?/init.lua|" -e "s|@LUA_CPATH@|$T/lib/?.so|" \
    -e "s|@PORT@|$PORT|" -e "s|@PIN@|$PIN|" bench/nginx/nginx.conf.in > "$T/conf/nginx.conf"
worker=$(nginx_start "$T" "$PORT")
for u in hello loglua counters counters100; do    # warm-up: JIT, caches
  $WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$PORT/$u" >/dev/null
done
# the Lua sampler's first start runs its self-tests (~30 ms) and its first
# drains read the symbol tables of nginx and its libraries: not in a round
curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=1&lua=1&hz=1000" >/dev/null
$WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$PORT/hello" >/dev/null
curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=0" >/dev/null
curl -sf "http://127.0.0.1:$PORT/perf/always?stats=1&reset=1" >/dev/null   # its cost figures: the rounds only

run() {   # $1 = mode -> prints "requests/s cpu-us-per-request"
  case $1 in baseline|sampler*|lua*) u=hello ;; *) u=$1 ;; esac
  case $1 in
    sampler) curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=1" >/dev/null ;;
    sampler10k) curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=1&hz=10000" >/dev/null ;;
    lua99) curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=1&lua=1&hz=99" >/dev/null ;;
    lua1k) curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=1&lua=1&hz=1000" >/dev/null ;;
  esac
  bin/luaperf stat -x, -e task-clock -p "$worker" -o "$T/tc.csv" -- sleep "$DUR" &
  lp=$!
  $WRK -t1 -c"$CONNS" -d"${DUR}s" "http://127.0.0.1:$PORT/$u" > "$T/wrk.txt"
  wait $lp
  case $1 in sampler*|lua*) curl -sf "http://127.0.0.1:$PORT/perf/sampler?on=0" >/dev/null ;; esac
  # the Lua sampler's own account (one profile, paused between its runs:
  # its figures add up over all lua99 and lua1k runs)
  case $1 in lua*) curl -sf "http://127.0.0.1:$PORT/perf/always?stats=1" > "$T/stats-lua" ;; esac
  rps=$(awk '/^Requests\/sec/ {print $2}' "$T/wrk.txt")
  awk -F, -v rps="$rps" -v dur="$DUR" '$3 == "task-clock" { printf "%s %.2f\n", rps, $1 * 1000 / (rps * dur) }' "$T/tc.csv"
}

MODES=${PE_BENCH_MODES:-"loglua counters counters100 sampler sampler10k lua99 lua1k"}
NMODES=$(echo $MODES | wc -w)
for r in $(seq "$ROUNDS"); do
  v=$(run baseline); echo "$r baseline $v" >> "$T/results"
  # rotate the order of the modes from round to round
  set -- $MODES; k=$(( (r - 1) % NMODES )); while [ $k -gt 0 ]; do m=$1; shift; set -- "$@" "$m"; k=$((k - 1)); done
  for m in "$@"; do
    v=$(run "$m"); echo "$r $m $v" >> "$T/results"
    v=$(run baseline); echo "$r baseline $v" >> "$T/results"
  done
  awk -v r="$r" '$1 == r { printf "round %s %-11s %10.0f req/s  %6.2f us CPU/request\n", $1, $2, $3, $4 }' "$T/results"
done

echo "--- hottest stacks under the samplers, all rounds (C: by function; Lua: with a Lua frame):"
curl -s "http://127.0.0.1:$PORT/perf/always" > "$T/always"
grep -v "@[^;]*:[0-9]" "$T/always" | head -3
grep "@[^;]*:[0-9]" "$T/always" | head -3
[ -f "$T/stats-lua" ] && echo "--- Lua sampler, all its runs: $(cat "$T/stats-lua")"
grep -c . "$T/logs/error.log" | awk '{print "--- error log lines: " $1}' || true
if [ -x build/bench/read_c ] || cc -O2 bench/read/read_c.c -o build/bench/read_c 2>/dev/null; then
  # the kernel's part of "counters": the same group read from C, on the worker's CPU
  c=$(taskset -c "$( [ "$(nproc)" -ge 2 ] && echo 1 || echo 0)" build/bench/read_c group3 200000 | awk '{print $3}')
  echo "--- C read(2) of the same 3-event group (task-clock, page-faults, context-switches): $c ns"
fi
echo "--- $ROUNDS rounds of ${DUR}s, wrk -t1 -c$CONNS, 1 nginx worker; change = median over rounds of"
echo "    (mode / mean of the baseline runs just before and after it) - 1"
awk '
  function median(list,   a, n, x, y, t) {
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { mode[NR] = $2; rps[NR] = $3; cpu[NR] = $4 }
  END {
    for (i = 1; i <= NR; i++) {
      m = mode[i]
      v[m] = v[m] " " rps[i]; c[m] = c[m] " " cpu[i]
      if (m != "baseline") {
        dr[m] = dr[m] " " (rps[i] / ((rps[i - 1] + rps[i + 1]) / 2) - 1) * 100
        dc[m] = dc[m] " " (cpu[i] / ((cpu[i - 1] + cpu[i + 1]) / 2) - 1) * 100
      }
    }
    n = split("baseline loglua counters counters100 sampler sampler10k lua99 lua1k", modes, " ")
    for (i = 1; i <= n; i++) {
      m = modes[i]
      if (m == "baseline")
        printf "%-11s %10.0f req/s              %6.2f us CPU/request\n", m, median(v[m]), median(c[m])
      else
        printf "%-11s %10.0f req/s  %+6.2f %%   %6.2f us CPU/request  %+6.2f %%\n", m, median(v[m]),
               median(dr[m]), median(c[m]), median(dc[m])
    }
  }' "$T/results"
