#!/bin/sh
# What the fleet endpoints of perf_event.openresty (/metrics, /debug/pprof/profile) cost the
# requests nginx serves: requests/s of /hello with wrk and the worker's CPU
# time per request, ONE nginx worker serving every mode:
#   baseline    /hello alone
#   metrics     /hello while /metrics is scraped every second (what a
#               Prometheus with scrape_interval: 1s does)
#   pprof       /hello while a 2 s /debug/pprof/profile is taken every 5 s
#               (a continuous profiler pulling often)
#   fleet       both at once
#   continuous  /hello under one profile for the whole run: the sampler's
#               own cost (signal, walk and drain per sample at 100 Hz); the
#               pprof mode samples 2 s of every 5, so it should cost about
#               0.4 times this
# Each round runs baseline, mode, baseline, mode, ..., baseline; every mode
# is compared with the mean of the two baseline runs around it (the paired
# method of bench/nginx, which cancels a shared VM's slow drift); the median
# change over the rounds is reported.  CPU per request comes from `luaperf
# stat -p WORKER -e task-clock` over each wrk run, so it includes the
# scrapes and the profiles the worker served meanwhile.
#   bench/fleet/run.sh [SECONDS_PER_RUN] [ROUNDS] [CONNECTIONS]
# Needs: nginx, libnginx-mod-http-lua, wrk, curl; 'make' done.
set -eu
cd "$(dirname "$0")/../.."
DUR=${1:-5}
ROUNDS=${2:-5}
CONNS=${3:-16}
PORT=${PE_BENCH_PORT:-$((20000 + $$ % 30000))}
command -v wrk >/dev/null || { echo "bench/fleet: needs wrk (apt-get install wrk)"; exit 2; }
command -v nginx >/dev/null || { echo "bench/fleet: needs nginx and libnginx-mod-http-lua"; exit 2; }
[ -f build/perf_event/core.so ] || { echo "bench/fleet: run 'make' first"; exit 2; }

T=$(mktemp -d /tmp/pe-bench-fleet.XXXXXX)
bg=""
stop() {
  for p in $bg; do kill "$p" 2>/dev/null || true; done
  if [ -f "$T/logs/nginx.pid" ]; then
    pid=$(cat "$T/logs/nginx.pid")
    kill -QUIT "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$T/logs/nginx.pid"
  fi
}
trap 'stop; rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
mkdir -p "$T/lua" "$T/lib/perf_event" "$T/conf" "$T/logs"
cp -r lua/perf_event "$T/lua/"
cp build/perf_event/core.so "$T/lib/perf_event/"
chmod -R a+rX "$T"

# With 2+ CPUs the worker runs on CPU 1 and wrk on CPU 0 (as bench/nginx)
if [ "$(nproc)" -ge 2 ]; then PIN=''; WRK="taskset -c 0 wrk"; else PIN='#'; WRK=wrk; fi

sed -e "s|@LUA_PATH@|$T/lua/?.lua;$T/lua/?/init.lua|" -e "s|@LUA_CPATH@|$T/lib/?.so|" \
    -e "s|@PORT@|$PORT|" -e "s|@PIN@|$PIN|" bench/fleet/nginx.conf.in > "$T/conf/nginx.conf"
nginx -p "$T" -c "$T/conf/nginx.conf"
URL="http://127.0.0.1:$PORT"
i=0
until curl -s -o /dev/null "$URL/hello"; do
  i=$((i + 1)); [ $i -lt 100 ] || { echo "nginx does not answer"; exit 1; }; sleep 0.05
done
worker=$(ps -o pid= --ppid "$(cat "$T/logs/nginx.pid")" | head -1 | tr -d ' ')

MODES="metrics pprof fleet continuous"
code=$(curl -s -o "$T/probe.pb.gz" -w '%{http_code}' "$URL/debug/pprof/profile?seconds=1")
if [ "$code" != 200 ]; then
  echo "bench/fleet: /debug/pprof/profile answers $code ($(head -c 200 "$T/probe.pb.gz")): metrics mode only"
  MODES="metrics"
fi
$WRK -t1 -c"$CONNS" -d1s "$URL/hello" >/dev/null    # warm-up: JIT, caches

scraper() {   # /metrics every second; one status code a line
  while :; do curl -s -o /dev/null -w '%{http_code}\n' "$URL/metrics" >> "$T/scrapes"; sleep 1; done
}
profiler() {  # a 2 s profile every 5 s; one "code bytes" a line
  sleep 0.5
  while :; do
    curl -s -o "$T/p.pb.gz" -w '%{http_code} %{size_download}\n' "$URL/debug/pprof/profile?seconds=2" >> "$T/profiles"
    sleep 3
  done
}

run() {   # $1 = mode -> prints "requests/s cpu-us-per-request"
  bg=""
  case $1 in metrics|fleet) scraper >/dev/null 2>&1 & bg="$bg $!" ;; esac
  case $1 in pprof|fleet) profiler >/dev/null 2>&1 & bg="$bg $!" ;; esac
  if [ "$1" = continuous ]; then
    curl -s -o "$T/c.pb.gz" -w '%{http_code} %{size_download}\n' \
         "$URL/debug/pprof/profile?seconds=$((DUR + 1))" >> "$T/continuous" &
    bg="$bg $!"
    sleep 0.3
  fi
  bin/luaperf stat -x, -e task-clock -p "$worker" -o "$T/tc.csv" -- sleep "$DUR" &
  lp=$!
  $WRK -t1 -c"$CONNS" -d"${DUR}s" "$URL/hello" > "$T/wrk.txt"
  wait $lp
  for p in $bg; do
    if [ "$1" = continuous ]; then wait "$p" || true; else kill "$p" 2>/dev/null || true; fi
  done
  bg=""
  rps=$(awk '/^Requests\/sec/ {print $2}' "$T/wrk.txt")
  awk -F, -v rps="$rps" -v dur="$DUR" '$3 == "task-clock" { printf "%s %.2f\n", rps, $1 * 1000 / (rps * dur) }' "$T/tc.csv"
}

nm=$(echo $MODES | wc -w)
for r in $(seq "$ROUNDS"); do
  v=$(run baseline); echo "$r baseline $v" >> "$T/results"
  # rotate the order of the modes from round to round
  set -- $MODES; k=$(( (r - 1) % nm )); while [ $k -gt 0 ]; do m=$1; shift; set -- "$@" "$m"; k=$((k - 1)); done
  for m in "$@"; do
    v=$(run "$m"); echo "$r $m $v" >> "$T/results"
    v=$(run baseline); echo "$r baseline $v" >> "$T/results"
  done
  awk -v r="$r" '$1 == r { printf "round %s %-10s %10.0f req/s  %6.2f us CPU/request\n", $1, $2, $3, $4 }' "$T/results"
done

sleep 2   # the last killed loops' curls end
# The direct costs, without load: the worker's CPU time over 200 scrapes in
# a row, and over one 2 s profile against 2 s idle (a profile's fixed cost:
# flush, aggregate, encode, gzip; its per-sample cost is the continuous mode)
tc_ms() { awk -F, '$3 == "task-clock" { print $1 }' "$T/d.csv"; }
bin/luaperf stat -x, -e task-clock -p "$worker" -o "$T/d.csv" -- \
  sh -c "for i in \$(seq 200); do curl -s -o /dev/null '$URL/metrics'; done"
echo "--- CPU of the worker per /metrics scrape (200 in a row, no load): $(tc_ms | awk '{printf "%.0f", $1 * 1000 / 200}') us"
bin/luaperf stat -x, -e task-clock -p "$worker" -o "$T/d.csv" -- sleep 2
idle=$(tc_ms)
if [ "$MODES" != metrics ]; then
  bin/luaperf stat -x, -e task-clock -p "$worker" -o "$T/d.csv" -- \
    curl -s -o /dev/null "$URL/debug/pprof/profile?seconds=2"
  echo "--- CPU of the worker for one 2 s profile (no load), over 2 s idle: $(tc_ms | awk -v i="$idle" '{printf "%.1f", $1 - i}') ms"
fi
[ -f "$T/scrapes" ] && awk '{n[$1]++} END {for (c in n) printf "--- /metrics scrapes: %d answered %s\n", n[c], c}' "$T/scrapes"
for f in profiles continuous; do
  [ -f "$T/$f" ] && awk -v f="$f" '{n[$1]++; b[$1] += $2}
    END {for (c in n) printf "--- %s profiles: %d answered %s (%.0f bytes each)\n", f, n[c], c, b[c] / n[c]}' "$T/$f"
done
grep -c . "$T/logs/error.log" | awk '{print "--- error log lines: " $1}' || true
echo "--- $ROUNDS rounds of ${DUR}s, wrk -t1 -c$CONNS, 1 nginx worker; change = median over rounds of"
echo "    (mode / mean of the baseline runs just before and after it) - 1"
awk -v modes="baseline $MODES" '
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
    n = split(modes, ms, " ")
    for (i = 1; i <= n; i++) {
      m = ms[i]
      if (m == "baseline")
        printf "%-10s %10.0f req/s              %6.2f us CPU/request\n", m, median(v[m]), median(c[m])
      else
        printf "%-10s %10.0f req/s  %+6.2f %%   %6.2f us CPU/request  %+6.2f %%\n", m, median(v[m]),
               median(dr[m]), median(c[m]), median(dc[m])
    }
    if (dc["continuous"] != "")
      printf "--- the sampler'"'"'s own cost at the pprof duty cycle (0.4 x continuous): %+.2f %% CPU/request\n",
             0.4 * median(dc["continuous"])
  }' "$T/results"
