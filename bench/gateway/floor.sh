#!/usr/bin/env bash
# What the stack costs and what rollgate adds, side by side in one run:
# core time per proxied request (utime + stime of the proxy's process over
# the requests wrk completed) of
#   nginx (plain proxy, keep-alive upstreams)
#   bare_proxy (the same stack as the gateway, doing nothing: hyper's
#     HTTP/1 server and client::conn, bodies streamed, nothing timed)
#   bare_proxy --like-gateway (+ rollgate's accept loop, both bodies read
#     whole, the upstream call timed: the gateway minus measurement)
#   rollgate plain (one model, champion only)
#   [rollgate built from another commit, if ROLLGATE_BASE is set]
# Each proxy has one thread (nginx one worker; rollgate `--threads 1` and
# bare_proxy: tokio's current-thread runtime) and shares core 0 with the
# nginx backend; wrk
# (c=16) runs on core 1. The setups alternate, ROUNDS times, so a change
# in the machine's load touches all of them.
# Needs: nginx, wrk (Debian packages), a release build of rollgate and of
# the example (`cargo build --release -p rollgate
#   && cargo build --release -p rollgate-gateway --example bare_proxy`).
# Usage: bench/gateway/floor.sh [seconds-per-cell] [rounds]   (default 5 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/gateway/lib.sh
SECS=${1:-5}
ROUNDS=${2:-3}
ROLLGATE=${ROLLGATE:-target/release/rollgate}
BARE=target/release/examples/bare_proxy
NAME=${NAME:-gateway-floor}
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
[ -x "$BARE" ] || cargo build --release -p rollgate-gateway --example bare_proxy
for t in nginx wrk taskset; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done

W=$(mktemp -d /tmp/rollgate-floor.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

ANSWER='{"predictions":[[0.1,0.9]]}'
nginx_conf() { # dir server-block
  mkdir -p "$1/logs"
  cat > "$1/nginx.conf" <<CONF
worker_processes 1; daemon off; master_process off; pid $1/nginx.pid; error_log $1/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  upstream champ { server 127.0.0.1:18481; keepalive 256; }
  $2
}
CONF
}
nginx_conf "$W/backend" "server { listen 127.0.0.1:18481; location / { default_type application/json; return 200 '$ANSWER'; } }"
taskset -c 0 nginx -p "$W/backend" -c "$W/backend/nginx.conf" & PIDS+=($!)
nginx_conf "$W/front" 'server { listen 127.0.0.1:18482; location / { proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://champ; } }'
taskset -c 0 nginx -p "$W/front" -c "$W/front/nginx.conf" & NGINX=$!; PIDS+=($NGINX)
taskset -c 0 "$BARE" 127.0.0.1:18483 127.0.0.1:18481 & BARE_PID=$!; PIDS+=($BARE_PID)
taskset -c 0 "$BARE" 127.0.0.1:18484 127.0.0.1:18481 --like-gateway & LIKE=$!; PIDS+=($LIKE)
gateway() { # binary port
  cat > "$W/gw-$2.toml" <<CONF
listen = "127.0.0.1:$2"
[limits]
max_concurrent = 100000
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18481" }
CONF
  taskset -c 0 "$1" gateway --config "$W/gw-$2.toml" --threads 1 >"$W/gw-$2.log" 2>&1 &
  PIDS+=($!)
}
gateway "$ROLLGATE" 18485; ROLLGATE_PID=${PIDS[-1]}
SETUPS=("nginx $NGINX 18482" "bare_proxy $BARE_PID 18483" "bare_proxy_like_gateway $LIKE 18484" "rollgate $ROLLGATE_PID 18485")
PORTS=(18481 18482 18483 18484 18485)
if [ -n "${ROLLGATE_BASE:-}" ]; then
  gateway "$ROLLGATE_BASE" 18486
  SETUPS+=("rollgate_base ${PIDS[-1]} 18486")
  PORTS+=(18486)
fi
wait_ports "${PORTS[@]}"
write_post_lua "$W/post.lua"

# Clock ticks of user and system time of a process.
ticks() { awk '{print $14, $15}' /proc/"$1"/stat; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))
RESULTS="$W/floor.tsv"
printf 'setup\tround\treq_per_s\tuser_us\tsys_us\tcore_us\tnon2xx\n' > "$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  for setup in "${SETUPS[@]}"; do
    set -- $setup
    taskset -c 1 wrk -t1 -c16 -d1s -s "$W/post.lua" "http://127.0.0.1:$3" >/dev/null 2>&1 # warm-up
    read -r u0 s0 < <(ticks "$2")
    out=$(taskset -c 1 wrk -t1 -c16 -d"${SECS}s" -s "$W/post.lua" "http://127.0.0.1:$3" 2>&1)
    read -r u1 s1 < <(ticks "$2")
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out"); non2xx=${non2xx:-0}
    awk -v l="$1" -v r="$round" -v n="$n" -v u=$(((u1 - u0) * TICK_US)) -v s=$(((s1 - s0) * TICK_US)) \
      -v secs="$SECS" -v bad="$non2xx" \
      'BEGIN { printf "%s\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%s\n", l, r, n / secs, u / n, s / n, (u + s) / n, bad }' \
      | tee -a "$RESULTS"
  done
done
cp "$RESULTS" "bench/results/$NAME.tsv"
python3 - "$RESULTS" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
by = {}
for r in rows:
    by.setdefault(r["setup"], []).append(r)
nginx = statistics.median(float(r["core_us"]) for r in by["nginx"])
print("| setup | req/s (median) | core-µs per request (median) | ÷ nginx |")
print("|---|---:|---:|---:|")
for setup, rs in by.items():
    core = statistics.median(float(r["core_us"]) for r in rs)
    rps = statistics.median(float(r["req_per_s"]) for r in rs)
    print(f"| {setup} | {rps:,.0f} | {core:.1f} | {core / nginx:.2f} |")
PY
echo "raw results: bench/results/$NAME.tsv"
