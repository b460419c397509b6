#!/bin/sh
# What an armed block profile (/debug/pprof/block) costs an nginx serving
# /hello.  One server made of doc/openresty.md's snippet (section 2, read
# from the doc; its paths, listen address, access_log off and a /hello
# location changed), one worker running as root (a block profile counts the
# kernel's switches: doc/openresty.md, section 6) pinned to CPU 1, wrk -t1
# on CPU 0.  Each round starts the server afresh, warms it up, then runs
# baseline, armed, baseline, armed, baseline for SECONDS each; "armed" is
# the same wrk run while a block window of SECONDS + 1 runs on the server
# (its answer must be 200).  A run's figures: requests/s, the worker's CPU
# per request (/proc/PID/schedstat), and its switches per request
# (voluntary and not, /proc/PID/status: each one is a sample of the armed
# profile and a SIGTRAP).  The paired change of "armed" is over the mean of
# the baselines around it, median over the rounds.
# The floor, measured in the same rounds on CPU 1 while the server idles:
# bench/nginx/switch_c.c, the CPU a switch costs with the block profile's
# event armed (a sample with sigtrap, the switch records, a handler that
# counts) over the same switches plain.  The account: the armed runs'
# switches per request times that cost (and the profile's own handler and
# drain, 0.2 + 0.5 us a switch, bench/README.md), over the baseline's CPU
# per request.
#   bench/nginx/block.sh [SECONDS_PER_RUN] [ROUNDS] [CONNECTIONS]
# Needs: root, nginx, libnginx-mod-http-lua, wrk, curl; 'make' done.
set -eu
cd "$(dirname "$0")/../.."
DUR=${1:-3}
ROUNDS=${2:-9}
CONNS=${3:-16}
PORT=${PE_BENCH_PORT:-28299}
[ "$(id -u)" = 0 ] || { echo "bench/nginx/block.sh: needs root (the block profile's worker runs as root)"; exit 2; }
. bench/nginx/lib.sh
bench_needs
mkdir -p build/bench
cc -O2 -Wall -Wextra -Werror bench/nginx/switch_c.c -o build/bench/switch_c

T=$(mktemp -d /tmp/pe-bench-block.XXXXXX)
trap 'nginx_stop "$T/s"; rm -rf "$T"' EXIT INT TERM
bench_tree "$T"
mkdir -p "$T/s/conf" "$T/s/logs"
if [ "$(nproc)" -ge 2 ]; then PIN=''; WCPU=1; WRK="taskset -c 0 wrk"; else PIN='#'; WCPU=0; WRK=wrk; fi

c="$T/s/conf/nginx.conf"
doc_snippet "$c"
change() {   # sed expression, what it must find
  grep -q -- "$2" "$c" || { echo "bench/nginx: doc/openresty.md's snippet has no '$2' any more"; exit 1; }
  sed -i -e "$1" "$c"
}
change "s|/usr/local/share/lua/5.1/|$T/lua/|g" "/usr/local/share/lua/5.1/"
change "s|/usr/local/lib/lua/5.1/|$T/lib/|g" "/usr/local/lib/lua/5.1/"
change "s|listen 8080;|listen 127.0.0.1:$PORT;|" "listen 8080;"
change 's|^http {|http {\n    access_log off;|' "^http {"
change 's|^\(        location = /metrics {\)|        location = /hello { content_by_lua_block { ngx.say("hello") } }\n\1|' \
  "^        location = /metrics {"
{ printf '%s\n' "user root;" "worker_processes 1;" "${PIN}worker_cpu_affinity 10;" "pid logs/nginx.pid;" \
    "error_log logs/error.log error;" \
    "load_module /usr/lib/nginx/modules/ndk_http_module.so;" \
    "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;" "events { worker_connections 1024; }"
  cat "$c"; } > "$c.new"
mv "$c.new" "$c"
chmod -R a+rX "$T"

cpu() { cut -d' ' -f1 "/proc/$1/schedstat"; }
sw() { awk '/^(voluntary|nonvoluntary)_ctxt_switches/ { n += $2 } END { print n }' "/proc/$1/status"; }

run() {   # $1 = mode, $2 = worker -> "requests/s cpu-us-per-request switches-per-request"
  if [ "$1" = armed ]; then
    curl -s -o "$T/block.pb" -w '%{http_code}' --max-time 60 \
      "http://127.0.0.1:$PORT/debug/pprof/block?seconds=$((DUR + 1))" > "$T/code" &
    cpid=$!
    sleep 0.5
  fi
  c0=$(cpu "$2"); s0=$(sw "$2")
  $WRK -t1 -c"$CONNS" -d"${DUR}s" "http://127.0.0.1:$PORT/hello" > "$T/wrk.txt"
  c1=$(cpu "$2"); s1=$(sw "$2")
  if [ "$1" = armed ]; then
    wait "$cpid"
    [ "$(cat "$T/code")" = 200 ] || { echo "bench/nginx: the block window answered $(cat "$T/code")" >&2; exit 1; }
  fi
  awk -v c0="$c0" -v c1="$c1" -v s0="$s0" -v s1="$s1" '
    /requests in/ { n = $1 }
    /^Requests\/sec/ { rps = $2 }
    /Non-2xx/ { bad = 1 }
    END {
      if (bad || n == 0) { print "bench/nginx: wrk saw errors" > "/dev/stderr"; exit 1 }
      printf "%s %.3f %.4f\n", rps, (c1 - c0) / 1000 / n, (s1 - s0) / n
    }' "$T/wrk.txt"
}

: > "$T/results"
: > "$T/floor"
for r in $(seq "$ROUNDS"); do
  w=$(nginx_start "$T/s" "$PORT")
  $WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$PORT/hello" >/dev/null
  for m in plain armed; do
    taskset -c "$WCPU" build/bench/switch_c "$m" 20000 | awk -v r="$r" '{ print r, $1, $2 }' >> "$T/floor"
  done
  for m in baseline armed baseline armed baseline; do
    echo "$r $m $(run "$m" "$w")" >> "$T/results"
  done
  e=$(grep -c . "$T/s/logs/error.log" || true)
  [ "$e" -eq 0 ] || { echo "round $r: error.log:"; cat "$T/s/logs/error.log"; }
  nginx_stop "$T/s"
  awk -v r="$r" '$1 == r { printf "round %s %-8s %8.0f req/s  %6.2f us CPU/request  %.3f switches/request\n", $1, $2, $3, $4, $5 }' \
    "$T/results"
done

echo "--- $ROUNDS rounds of ${DUR}s per run, wrk -t1 -c$CONNS, 1 worker (root) pinned to CPU $WCPU, load $(cut -d' ' -f1-3 /proc/loadavg)"
awk '
  function median(list,   a, n, x, y, t) {
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function se(list,   a, n, x, m, v) {
    n = split(list, a, " "); if (n < 2) return 0
    for (x = 1; x <= n; x++) m += a[x]; m /= n
    for (x = 1; x <= n; x++) v += (a[x] - m) ^ 2
    return 1.2533 * sqrt(v / (n - 1)) / sqrt(n)
  }
  FILENAME ~ /floor$/ { fl[$2] = fl[$2] " " $3; if ($2 == "armed") d = d " " ($3 - last); last = $3; next }
  { nr++; mode[nr] = $2; rps[nr] = $3; cpu[nr] = $4; sw[nr] = $5 }
  END {
    for (i = 1; i <= nr; i++) {
      c[mode[i]] = c[mode[i]] " " cpu[i]; s[mode[i]] = s[mode[i]] " " sw[i]; v[mode[i]] = v[mode[i]] " " rps[i]
      if (mode[i] != "armed") continue
      dr = dr " " (rps[i] / ((rps[i - 1] + rps[i + 1]) / 2) - 1) * 100
      dc = dc " " (cpu[i] / ((cpu[i - 1] + cpu[i + 1]) / 2) - 1) * 100
    }
    per = median(d) / 1000 + 0.7
    printf "baseline: %.0f req/s, %.2f us CPU/request, %.3f switches/request\n", median(v["baseline"]), median(c["baseline"]), median(s["baseline"])
    printf "armed:    %.0f req/s (%+.2f %%, s.e. %.2f), %.2f us CPU/request (%+.2f %%, s.e. %.2f), %.3f switches/request\n",
           median(v["armed"]), median(dr), se(dr), median(c["armed"]), median(dc), se(dc), median(s["armed"])
    printf "floor (CPU %s): a switch %.2f us plain, +%.2f us armed (switch_c); with the handler and drain, %.2f us a switch\n",
           "'"$WCPU"'", median(fl["plain"]) / 1000, median(d) / 1000, per
    printf "account: %.3f switches/request x %.2f us = %.3f us a request, %.2f %% of the baseline'"'"'s CPU per request\n",
           median(s["armed"]), per, median(s["armed"]) * per, 100 * median(s["armed"]) * per / median(c["baseline"])
  }' "$T/floor" "$T/results"
