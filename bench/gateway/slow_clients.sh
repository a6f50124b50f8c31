#!/usr/bin/env bash
# Hostile clients beside real users (issue "The data plane on real traffic"):
# 200 slowloris connections and 60 slow-body clients against a gateway with
# max_concurrent = 50, real users' latency (wrk, 4 connections) with and
# without them, alternated twice in one run. Backend: nginx answering a
# fixed JSON body. Default client timeouts (header 10 s, body 30 s).
# Needs: nginx, wrk, python3, a release build of rollgate.
# Usage: bench/gateway/slow_clients.sh [seconds-per-cell]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-10}
ROLLGATE=target/release/rollgate
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx wrk python3; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done
W=$(mktemp -d /tmp/rollgate-slow.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$W/logs"
cat > "$W/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/nginx.pid; error_log $W/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:18181; location / { default_type application/json; return 200 '{"predictions":[[0.1,0.9]]}'; } } }
CONF
nginx -p "$W" -c "$W/nginx.conf" & PIDS+=($!)
cat > "$W/gw.toml" <<CONF
listen = "127.0.0.1:18190"
[limits]
max_concurrent = 50
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18181" }
CONF
ulimit -n 65536 2>/dev/null || true
"$ROLLGATE" gateway --config "$W/gw.toml" --threads 1 >"$W/gw.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:18190/healthz >/dev/null 2>&1 && break; sleep 0.1; done
echo "# $(date -u +%FT%TZ) $(nproc) cores; bench/gateway/slow_clients.sh $SECS"
python3 bench/gateway/slow_clients.py 127.0.0.1:18190 --seconds "$SECS"
