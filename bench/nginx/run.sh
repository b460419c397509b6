#!/bin/sh
# Requests/s of nginx on loopback with wrk: without the perfreq module
# (baseline), with an empty log_by_lua handler ("loglua": the price of any
# log-phase Lua, perf or not), with per-request counters in log_by_lua
# (every request: "counters"; one request in 100: "counters100"), and with an always-on
# 1 kHz sampler drained every 100 ms by a timer ("sampler").
# Rounds are interleaved (baseline, counters, sampler, baseline, ...) and
# the median of each mode is reported with its drop against the baseline.
# Throughput on a shared machine is noisy, so each run also measures the
# worker's CPU time per request with `luaperf stat -p WORKER -e task-clock`
# over the wrk run: the cost the module adds, independent of contention.
#   bench/nginx/run.sh [SECONDS_PER_RUN] [ROUNDS] [CONNECTIONS]
# Needs: nginx, libnginx-mod-http-lua, wrk; 'make' done.
set -eu
cd "$(dirname "$0")/../.."
DUR=${1:-10}
ROUNDS=${2:-3}
CONNS=${3:-16}
PORT=${PE_BENCH_PORT:-28099}
command -v wrk >/dev/null || { echo "bench/nginx: needs wrk (apt-get install wrk)"; exit 2; }
command -v nginx >/dev/null || { echo "bench/nginx: needs nginx and libnginx-mod-http-lua"; exit 2; }
[ -f build/perf_event/core.so ] || { echo "bench/nginx: run 'make' first"; exit 2; }

T=$(mktemp -d /tmp/pe-bench.XXXXXX)
trap 'stop; rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
mkdir -p "$T/lua" "$T/lib/perf_event" "$T/conf" "$T/logs"
cp -r lua/perf_event "$T/lua/"
cp examples/openresty/lua/perfreq.lua "$T/lua/"
cp build/perf_event/core.so "$T/lib/perf_event/"
chmod -R a+rX "$T"

stop() {
  if [ -f "$T/logs/nginx.pid" ]; then
    pid=$(cat "$T/logs/nginx.pid")
    kill -QUIT "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$T/logs/nginx.pid"
  fi
}

# With 2+ CPUs the worker runs on CPU 1 and wrk on CPU 0, so the two do not
# take turns on one CPU (the largest source of noise on a small VM).
if [ "$(nproc)" -ge 2 ]; then PIN=''; WRK="taskset -c 0 wrk"; else PIN='#'; WRK=wrk; fi

start() {   # $1 = baseline | loglua | counters | counters100 | sampler
  c='#'; h='#'; s='#'; l='#'
  [ "$1" = loglua ] && l=''
  [ "$1" = counters ] && c=''
  [ "$1" = counters100 ] && h=''
  [ "$1" = sampler ] && s=''
  sed -e "s|@LUA_PATH@|$T/lua/?.lua;$T/lua/?/init.lua|" -e "s|@LUA_CPATH@|$T/lib/?.so|" \
      -e "s|@PORT@|$PORT|" -e "s|@MODE_COUNTERS@|$c|g" -e "s|@MODE_COUNTERS100@|$h|g" \
      -e "s|@MODE_SAMPLER@|$s|g" -e "s|@MODE_LOGLUA@|$l|g" -e "s|@PIN@|$PIN|" \
      bench/nginx/nginx.conf.in > "$T/conf/nginx.conf"
  nginx -p "$T" -c "$T/conf/nginx.conf"
  i=0
  until curl -s -o /dev/null "http://127.0.0.1:$PORT/hello"; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "nginx does not answer"; exit 1; }; sleep 0.05
  done
}

run() {   # prints "requests/s cpu-us-per-request"
  master=$(cat "$T/logs/nginx.pid")
  worker=$(ps -o pid= --ppid "$master" | head -1 | tr -d ' ')
  bin/luaperf stat -x, -e task-clock -p "$worker" -o "$T/tc.csv" -- sleep "$DUR" &
  lp=$!
  $WRK -t1 -c"$CONNS" -d"${DUR}s" "http://127.0.0.1:$PORT/hello" > "$T/wrk.txt"
  wait $lp
  rps=$(awk '/^Requests\/sec/ {print $2}' "$T/wrk.txt")
  awk -F, -v rps="$rps" -v dur="$DUR" '$3 == "task-clock" { printf "%s %.2f\n", rps, $1 * 1000 / (rps * dur) }' "$T/tc.csv"
}

for r in $(seq "$ROUNDS"); do
  for m in baseline loglua counters counters100 sampler; do
    start $m
    $WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$PORT/hello" >/dev/null   # warm-up
    v=$(run)
    if [ $m = sampler ]; then
      curl -s "http://127.0.0.1:$PORT/perf/always" | sort -t' ' -k2 -n | tail -3 > "$T/top.txt"
    fi
    stop
    echo "$m $v" >> "$T/results"
    echo "round $r: $m $v" | awk '{ printf "round %s %-11s %10.0f req/s  %6.2f us CPU/request\n", $2, $3, $4, $5 }' 
  done
done

echo "--- hottest functions under the sampler (last round):"
cat "$T/top.txt"
echo "--- median requests/s over $ROUNDS rounds of ${DUR}s, wrk -t1 -c$CONNS, 1 nginx worker:"
awk '
  function median(list,   a, n, x, y, t) {
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { v[$1] = v[$1] " " $2; c[$1] = c[$1] " " $3 }
  END {
    split("baseline loglua counters counters100 sampler", modes, " ")
    for (i = 1; i <= 5; i++) { m = modes[i]; med[m] = median(v[m]); cpu[m] = median(c[m]) }
    for (i = 1; i <= 5; i++) {
      m = modes[i]
      printf "%-11s %10.0f req/s  %+6.2f %%   %6.2f us CPU/request  %+6.2f %%\n", m, med[m],
             100 * (med[m] - med["baseline"]) / med["baseline"], cpu[m],
             100 * (cpu[m] - cpu["baseline"]) / cpu["baseline"]
    }
  }' "$T/results"
