#!/usr/bin/env bash
# The CPU cost of compressing answers for clients that accept gzip: one
# gateway (--threads 1) in front of nginx answering a 1,041-byte prediction
# body (a 64-row batch); wrk (1 thread, 8 connections) with and without
# `Accept-Encoding: gzip`, alternated twice in one run; gateway and nginx
# pinned to core 0, wrk to core 1.
# Needs: nginx, wrk, taskset, a release build of rollgate.
# Usage: bench/gateway/gzip.sh [seconds-per-cell]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-10}
ROLLGATE=target/release/rollgate
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx wrk taskset; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done
W=$(mktemp -d /tmp/rollgate-gzip.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
ROWS=$(python3 -c 'print(",".join("[0.%04d,0.%04d]" % (i, 9999 - i) for i in range(64)))')
BODY="{\"predictions\":[$ROWS]}"
mkdir -p "$W/logs"
cat > "$W/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/nginx.pid; error_log $W/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000; gzip off;
  server { listen 127.0.0.1:18281; location / { default_type application/json; return 200 '$BODY'; } } }
CONF
taskset -c 0 nginx -p "$W" -c "$W/nginx.conf" & PIDS+=($!)
cat > "$W/gw.toml" <<CONF
listen = "127.0.0.1:18290"
[limits]
max_concurrent = 100000
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18281" }
CONF
taskset -c 0 "$ROLLGATE" gateway --config "$W/gw.toml" --threads 1 >"$W/gw.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:18290/healthz >/dev/null 2>&1 && break; sleep 0.1; done
cat > "$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"instances":[[1.0,2.0,3.0]]}'
wrk.headers["content-type"] = "application/json"
LUA
echo "# $(date -u +%FT%TZ) $(nproc) cores; bench/gateway/gzip.sh $SECS; body ${#BODY} bytes"
printf "cell\trequests_per_s\tp50_ms\tp99_ms\ttransfer_per_s\n"
cell() { # name extra-args
  local out; out=$(taskset -c 1 wrk -t1 -c8 -d"${SECS}s" --latency -s "$W/post.lua" "${@:2}" http://127.0.0.1:18290/v1/models/m:predict)
  local rps p50 p99 xfer
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  xfer=$(awk '/Transfer\/sec/ {print $2}' <<<"$out")
  printf "%s\t%s\t%s\t%s\t%s\n" "$1" "$rps" "$p50" "$p99" "$xfer"
}
for _ in 1 2; do
  cell identity
  cell gzip -H "Accept-Encoding: gzip"
done
