# bench/nginx/lib.sh - what the nginx benches share, sourced by run.sh,
# module.sh and block.sh: their prerequisites, the tree their servers load,
# doc/openresty.md's snippet, starting and stopping an nginx.  No `ps` (a
# minimal Debian has none): a worker is found in /proc.

# bench_needs: wrk, nginx and the built core, or exit 2 saying which
bench_needs() {
  command -v wrk >/dev/null || { echo "bench/nginx: needs wrk (apt-get install wrk)"; exit 2; }
  command -v nginx >/dev/null || { echo "bench/nginx: needs nginx and libnginx-mod-http-lua"; exit 2; }
  [ -f build/perf_event/core.so ] || { echo "bench/nginx: run 'make' first"; exit 2; }
}

# bench_tree DIR: DIR/lua/perf_event and DIR/lib/perf_event/core.so, DIR
# itself readable by the workers (nobody)
bench_tree() {
  chmod 755 "$1"
  mkdir -p "$1/lua" "$1/lib/perf_event"
  cp -r lua/perf_event "$1/lua/"
  cp build/perf_event/core.so "$1/lib/perf_event/"
}

# doc_snippet FILE: doc/openresty.md's nginx.conf lines (between "```nginx"
# and "```" under its section 2) into FILE
doc_snippet() {
  awk '/^## 2\. The nginx\.conf lines/ { s = 1 } s && /^```nginx/ { f = 1; next } f && /^```/ { exit } f' \
    doc/openresty.md > "$1"
}

# nginx_start PREFIX PORT: starts the nginx of PREFIX (its conf/nginx.conf),
# waits until http://127.0.0.1:PORT/hello answers, and prints the pid of
# its (first) worker
nginx_start() {
  nginx -p "$1" -c "$1/conf/nginx.conf"
  i=0
  until curl -s -o /dev/null "http://127.0.0.1:$2/hello"; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "bench/nginx: nginx in $1 does not answer" >&2; cat "$1/logs/error.log" >&2; exit 1; }
    sleep 0.05
  done
  master=$(cat "$1/logs/nginx.pid")
  for d in /proc/[0-9]*; do
    # field 4 of /proc/PID/stat, after the command in parentheses
    ppid=$(sed -n 's/^[0-9]* (.*) . \([0-9]*\) .*/\1/p' "$d/stat" 2>/dev/null) || continue
    [ "$ppid" = "$master" ] && { echo "${d#/proc/}"; return 0; }
  done
  echo "bench/nginx: no worker of nginx $master" >&2
  exit 1
}

# nginx_stop PREFIX: stops the nginx of PREFIX (QUIT) and waits until it
# is gone; nothing when it does not run
nginx_stop() {
  if [ -f "$1/logs/nginx.pid" ]; then
    pid=$(cat "$1/logs/nginx.pid")
    kill -QUIT "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$1/logs/nginx.pid"
  fi
}
