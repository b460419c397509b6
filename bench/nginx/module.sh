#!/bin/sh
# What perf_event.openresty costs an nginx, configured as doc/openresty.md
# says: the nginx.conf of each server below IS that doc's snippet (section
# 2, read from the doc; only its paths, its listen address and two test
# locations are changed), so the bench measures what a user runs.
#
# Three nginx servers, one worker each, all pinned to CPU 1 (wrk on CPU 0):
#   A  init_worker()                    (the snippet without the sampler)
#   N  init_worker()                    (A's twin: another process, same conf)
#   B  init_worker({ sampler = true })  (the snippet as the doc has it:
#                                        the always-on 99 Hz Lua-level sampler)
# In all three, log() runs in the log phase of every request (the snippet's
# http-level log_by_lua_block) except on /loglua, whose empty log_by_lua
# replaces it.  Modes, each against the baseline A:/hello:
#   null      N:/hello   the same configuration in another process: how far
#                        two processes and two moments differ when nothing
#                        does (the resolution of "sampler")
#   sampler   B:/hello   the always-on 99 Hz Lua-level sampler's cost
#   emptylog  A:/loglua  log() replaced by an empty log phase: log()'s own
#                        cost is A:/hello minus this, in worker CPU per request
# The sampler's own account, beside the paired figures: B has one more
# location, /bench/account (bench/nginx/account.lua, not the doc's), which
# after the warm-up wraps the always-on profile's drain with os.clock() and
# at the round's end reports the samples, the drains' CPU time and the stack
# walks' own time (safe-point captures; none when the profile fell back to
# C leaf frames: it says why); against B's CPU time from
# schedstat over the same span that is the sampler's share of the worker's
# CPU (the kernel's side of a sample, interrupt and signal, is not in it).
# Each round starts the three servers afresh (so no mode keeps one lucky or
# unlucky process for the whole run), warms them up, then runs baseline,
# mode, baseline, mode, ..., baseline for SECONDS each (the modes' order
# rotates); a mode's change is its figure over the mean of the two baseline
# runs around it; the summary gives the median over the rounds and the
# spread.  Worker CPU per request comes from the worker's /proc/PID/schedstat
# (nanoseconds on CPU) over each wrk run divided by the requests wrk counted;
# its kernel share from the utime/stime ticks of /proc/PID/stat.  The floor
# of log() is measured in the same rounds, on the workers' CPU, while the
# servers idle: C reading the same 3-event group with one read(2)
# (build/bench/read_c group3) and the binding's g:read(t) in a LuaJIT loop
# (bench/read/read.lua group3, FFI route).
# PE_BENCH_PATH=spin runs baseline, null and sampler on /spin instead of
# /hello: a request that spends about all of its time in a Lua loop (the
# sampler's samples are taken in user space only, so on /hello, mostly
# kernel time, it takes far fewer than 99 a CPU second).
#   bench/nginx/module.sh [SECONDS_PER_RUN] [ROUNDS] [CONNECTIONS]
# Needs: nginx, libnginx-mod-http-lua, wrk, curl; 'make' done.
set -eu
cd "$(dirname "$0")/../.."
DUR=${1:-3}
ROUNDS=${2:-11}
CONNS=${3:-16}
PORT=${PE_BENCH_PORT:-28199}
P=${PE_BENCH_PATH:-hello}   # or spin: the baseline, null and sampler modes on a Lua-bound request
. bench/nginx/lib.sh
bench_needs
mkdir -p build/bench
cc -O2 -Wall -Wextra -Werror bench/read/read_c.c -o build/bench/read_c

T=$(mktemp -d /tmp/pe-bench-mod.XXXXXX)
SERVERS="a n b"
stop_all() { for s in $SERVERS; do nginx_stop "$T/$s"; done; }
trap 'stop_all; rm -rf "$T"' EXIT INT TERM
bench_tree "$T"
cp bench/nginx/account.lua "$T/lua/"

if [ "$(nproc)" -ge 2 ]; then PIN=''; WCPU=1; WRK="taskset -c 0 wrk"; else PIN='#'; WCPU=0; WRK=wrk; fi

# the doc's snippet, between "```nginx" and "```" under its section 2
doc_snippet "$T/snippet"
# each change must apply exactly where the doc has it, or the bench stops
change() {   # file, sed expression, what it must find
  n=$(grep -c -- "$3" "$1" || true)
  [ "$n" -ge 1 ] || { echo "bench/nginx: doc/openresty.md's snippet has no '$3' any more"; exit 1; }
  sed -i -e "$2" "$1"
}
port_of() { case $1 in a) echo "$PORT" ;; n) echo $((PORT + 1)) ;; b) echo $((PORT + 2)) ;; esac; }
for s in $SERVERS; do
  mkdir -p "$T/$s/conf" "$T/$s/logs"
  c="$T/$s/conf/nginx.conf"
  cp "$T/snippet" "$c"
  change "$c" "s|/usr/local/share/lua/5.1/|$T/lua/|g" "/usr/local/share/lua/5.1/"
  change "$c" "s|/usr/local/lib/lua/5.1/|$T/lib/|g" "/usr/local/lib/lua/5.1/"
  change "$c" "s|listen 8080;|listen 127.0.0.1:$(port_of "$s");|" "listen 8080;"
  [ "$s" = b ] || change "$c" 's|init_worker({ sampler = true })|init_worker()|' "init_worker({ sampler = true })"
  [ "$s" != b ] || change "$c" 's|^\(        location = /metrics {\)|        location = /bench/account { content_by_lua_block { require("account").handler() } }\n\1|' \
    "^        location = /metrics {"
  change "$c" 's|^http {|http {\n    access_log off;|' "^http {"
  change "$c" 's|^\(        location = /metrics {\)|        location = /hello { content_by_lua_block { ngx.say("hello") } }\n        location = /spin { content_by_lua_block { local s = 0 for i = 1, 100000 do s = (s * 31 + i) % 1000003 end ngx.say(s) } }\n        location = /loglua {\n            log_by_lua_block { local _ = 1 }\n            content_by_lua_block { ngx.say("hello") }\n        }\n\1|' \
    "^        location = /metrics {"
  { printf '%s\n' "worker_processes 1;" "${PIN}worker_cpu_affinity 10;" "pid logs/nginx.pid;" \
      "error_log logs/error.log error;" \
      "load_module /usr/lib/nginx/modules/ndk_http_module.so;" \
      "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;" "events { worker_connections 1024; }"
    cat "$c"; } > "$c.new"
  mv "$c.new" "$c"
done
chmod -R a+rX "$T"

start() {   # $1 = server -> its worker's pid in $T/$1/worker
  nginx_start "$T/$1" "$(port_of "$1")" > "$T/$1/worker"
}

# worker CPU (schedstat ns, stat utime and stime ticks)
cpu() { echo "$(cut -d' ' -f1 "/proc/$1/schedstat") $(awk '{print $14, $15}' "/proc/$1/stat")"; }

run() {   # $1 = mode -> "requests/s cpu-us-per-request kernel-share-%"
  case $1 in
    baseline) s=a; u=$P ;; null) s=n; u=$P ;; sampler) s=b; u=$P ;; emptylog) s=a; u=loglua ;;
    *) echo "unknown mode $1" >&2; exit 1 ;;
  esac
  w=$(cat "$T/$s/worker")
  c0=$(cpu "$w")
  $WRK -t1 -c"$CONNS" -d"${DUR}s" "http://127.0.0.1:$(port_of "$s")/$u" > "$T/wrk.txt"
  c1=$(cpu "$w")
  awk -v c0="$c0" -v c1="$c1" '
    /requests in/ { n = $1 }
    /^Requests\/sec/ { rps = $2 }
    /Non-2xx/ { bad = 1 }
    END {
      split(c0, a, " "); split(c1, b, " ")
      if (bad || n == 0) { print "bench/nginx: wrk saw errors" > "/dev/stderr"; exit 1 }
      ticks = (b[2] - a[2]) + (b[3] - a[3])
      printf "%s %.3f %.1f\n", rps, (b[1] - a[1]) / 1000 / n, ticks ? 100 * (b[3] - a[3]) / ticks : 0
    }' "$T/wrk.txt"
}

MODES=${PE_BENCH_MODES:-"null sampler emptylog"}
# shellcheck disable=SC2086  # (word splitting wanted)
NMODES=$(echo $MODES | wc -w)
: > "$T/results"
for r in $(seq "$ROUNDS"); do
  for s in $SERVERS; do start "$s"; done
  for s in $SERVERS; do     # warm-up: JIT, caches; B's sampler self-tests and first drains
    $WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$(port_of "$s")/hello" >/dev/null
    $WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$(port_of "$s")/loglua" >/dev/null
    [ "$P" = hello ] || $WRK -t1 -c"$CONNS" -d1s "http://127.0.0.1:$(port_of "$s")/$P" >/dev/null
  done
  # the floor, on the workers' CPU while they idle
  taskset -c "$WCPU" build/bench/read_c group3 200000 | awk -v r="$r" '{print r, "read_c", $3}' >> "$T/floor"
  taskset -c "$WCPU" luajit bench/read/read.lua group3 200000 ffi | awk -v r="$r" '{print r, "read_lua", $3}' >> "$T/floor"
  load=$(cut -d' ' -f1 /proc/loadavg); echo "$r $load" >> "$T/load"
  bw=$(cat "$T/b/worker")
  curl -sf "http://127.0.0.1:$(port_of b)/bench/account?arm=1" >/dev/null
  bc0=$(cut -d' ' -f1 "/proc/$bw/schedstat")
  bt0=$(date +%s.%N)
  v=$(run baseline); echo "$r baseline $v" >> "$T/results"
  # shellcheck disable=SC2086
  set -- $MODES; k=$(( (r - 1) % NMODES )); while [ $k -gt 0 ]; do m=$1; shift; set -- "$@" "$m"; k=$((k - 1)); done
  for m in "$@"; do
    v=$(run "$m"); echo "$r $m $v" >> "$T/results"
    v=$(run baseline); echo "$r baseline $v" >> "$T/results"
  done
  a=$(curl -s "http://127.0.0.1:$(port_of b)/bench/account")
  echo "$r $a $(( $(cut -d' ' -f1 "/proc/$bw/schedstat") - bc0 )) $(echo "$(date +%s.%N) - $bt0" | bc)" >> "$T/account"
  for s in $SERVERS; do
    e=$(grep -c . "$T/$s/logs/error.log" || true)
    [ "$e" -eq 0 ] || { echo "round $r: nginx $s error.log:"; cat "$T/$s/logs/error.log"; }
  done
  stop_all
  awk -v r="$r" -v l="$load" '$1 == r { printf "round %s %-9s %8.0f req/s  %6.2f us CPU/request  kernel %4.1f %%  (load %s)\n",
                                       $1, $2, $3, $4, $5, l }' "$T/results"
done

echo "--- $ROUNDS rounds of ${DUR}s per run, wrk -t1 -c$CONNS, 1 worker per nginx pinned to CPU $WCPU, fresh servers each round"
awk '{ print $2 }' "$T/load" | sort -n | awk '{ a[NR] = $1 } END { printf "--- load average (1 min) at the rounds'"'"' start: min %s, median %s, max %s (%s CPUs)\n", a[1], a[int((NR + 1) / 2)], a[NR], "'"$(nproc)"'" }'
[ -s "$T/account" ] && awk '
  # round, samples, drains, drain ns, walks, walk ns, walk, why, maps reads, B CPU ns, seconds (all since the arming)
  NF == 11 { n += $2; dr += $3; dt += $4; k += $5; wt += $6; mr += $9; cpu += $10; wall += $11; walk = $7; why = $8 }
  END {
    sps = cpu ? n / (cpu / 1e9) : 0; dps = wall ? dr / wall : 0; dd = dr ? dt / dr : 0; ww = k ? wt / k : 0
    printf "--- sampler (B): %d samples over %.1f s of its worker CPU = %.1f per CPU second (user space only: a sample falling in the kernel is not taken)\n", n, cpu / 1e9, sps
    printf "--- sampler (B), its own account: walk %s%s\n", walk, why != "nil" ? " (" why ")" : ""
    printf "    %d drains, %.2f a second, %.0f us each (%.1f samples each, /proc/self/maps read %d times); stack walks %.1f us each (%d)\n", dr, dps, dd / 1e3, dr ? n / dr : 0, mr, ww / 1e3, k
    printf "    on a busy worker (1 CPU second a second): %.0f us of drains + %.0f us of walks a second = %.3f %% of its CPU\n",
           dd * dps / 1e3, ww * sps / 1e3, (dd * dps + ww * sps) / 1e9 * 100
  }' "$T/account"
awk '
  function median(list,   a, n, x, y, t) {
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function q(list, p,   a, n, x, y, t) {   # the p-quantile, nearest rank
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
    x = int(p * n + 0.5); if (x < 1) x = 1; if (x > n) x = n
    return a[x]
  }
  function se(list,   a, n, x, m, v) {   # standard error of a median: 1.2533 sd / sqrt(n)
    n = split(list, a, " "); if (n < 2) return 0
    for (x = 1; x <= n; x++) m += a[x]; m /= n
    for (x = 1; x <= n; x++) v += (a[x] - m) ^ 2
    return 1.2533 * sqrt(v / (n - 1)) / sqrt(n)
  }
  FILENAME ~ /floor$/ { fl[$2] = fl[$2] " " $3; next }
  { nr++; round[nr] = $1; mode[nr] = $2; rps[nr] = $3; cpu[nr] = $4; ks[nr] = $5 }
  END {
    for (i = 1; i <= nr; i++) {
      m = mode[i]
      v[m] = v[m] " " rps[i]; c[m] = c[m] " " cpu[i]; k[m] = k[m] " " ks[i]
      if (m == "baseline") { rb[round[i]] = rb[round[i]] " " rps[i]; continue }
      mb = (rps[i - 1] + rps[i + 1]) / 2; cb = (cpu[i - 1] + cpu[i + 1]) / 2
      dr[m] = dr[m] " " (rps[i] / mb - 1) * 100
      dc[m] = dc[m] " " (cpu[i] / cb - 1) * 100
      du[m] = du[m] " " (cb - cpu[i])
      # how far the two baselines around a mode differ: the drift within a pair
      bb = bb " " (rps[i + 1] / rps[i - 1] - 1) * 100
    }
    for (r in rb) rbm = rbm " " median(rb[r])
    printf "baseline A:/'"$P"': %.0f req/s (runs: min %.0f, max %.0f; round medians: min %.0f, max %.0f), %.2f us CPU/request, kernel %.1f %% of it\n",
           median(v["baseline"]), q(v["baseline"], 0), q(v["baseline"], 1), q(rbm, 0), q(rbm, 1),
           median(c["baseline"]), median(k["baseline"])
    printf "the two baselines around a mode differ by (second/first - 1): median %+.2f %%, quartiles %+.2f %% .. %+.2f %%\n",
           median(bb), q(bb, 0.25), q(bb, 0.75)
    printf "%-9s %8s %9s %19s %8s %9s %19s\n", "mode", "req/s", "change", "(quartiles; s.e.)", "us/req", "change", "(quartiles; s.e.)"
    n = split("null sampler emptylog", modes, " ")
    for (i = 1; i <= n; i++) {
      m = modes[i]; if (!(m in v)) continue
      printf "%-9s %8.0f %+8.2f%% (%+5.2f..%+5.2f; %.2f) %8.2f %+8.2f%% (%+5.2f..%+5.2f; %.2f)\n", m, median(v[m]),
             median(dr[m]), q(dr[m], 0.25), q(dr[m], 0.75), se(dr[m]),
             median(c[m]), median(dc[m]), q(dc[m], 0.25), q(dc[m], 0.75), se(dc[m])
    }
    if ("emptylog" in v)
      printf "log() per request: %.3f us of worker CPU (median of A:/hello - A:/loglua; quartiles %.3f .. %.3f)\n",
             median(du["emptylog"]), q(du["emptylog"], 0.25), q(du["emptylog"], 0.75)
    printf "the floor, same rounds, CPU %s: C read(2) of the group %.0f ns (%.0f..%.0f), the binding'"'"'s g:read(t) in LuaJIT %.0f ns (%.0f..%.0f)\n",
           "'"$WCPU"'", median(fl["read_c"]), q(fl["read_c"], 0), q(fl["read_c"], 1),
           median(fl["read_lua"]), q(fl["read_lua"], 0), q(fl["read_lua"], 1)
  }' "$T/floor" "$T/results"
