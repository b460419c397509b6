# bench/nginx/lib.sh - starting and stopping a bench's nginx, sourced by
# run.sh and module.sh.  No `ps` (a minimal Debian has none): a worker is
# found in /proc.

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
