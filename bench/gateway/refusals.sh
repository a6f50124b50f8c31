#!/usr/bin/env bash
# Valid requests after the gateway's own refusals on a keep-alive
# connection (issue "The data plane keeps every connection it answers"):
# 10,000 valid predictions, each after a refused request on the same
# connection (unknown model, wrong protocol, no route; every 50th refused
# body 200 ms late). Target: 0 failures. Backend: nginx answering a fixed
# JSON body. Needs: nginx, python3, a release build of rollgate.
# Usage: bench/gateway/refusals.sh [valid-requests]   (default 10000)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-10000}
ROLLGATE=${ROLLGATE:-target/release/rollgate}
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx python3 curl; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done
W=$(mktemp -d /tmp/rollgate-refusals.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$W/logs"
cat > "$W/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/nginx.pid; error_log $W/logs/error.log crit;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:18281; location / { default_type application/json; return 200 '{"predictions":[[0.1,0.9]]}'; } } }
CONF
nginx -p "$W" -c "$W/nginx.conf" & PIDS+=($!)
cat > "$W/gw.toml" <<CONF
listen = "127.0.0.1:18290"
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18281" }
CONF
"$ROLLGATE" gateway --config "$W/gw.toml" --threads 1 >"$W/gw.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:18290/healthz >/dev/null 2>&1 && break; sleep 0.1; done
echo "# $(date -u +%FT%TZ) $(nproc) cores; ROLLGATE=$ROLLGATE bench/gateway/refusals.sh $N"
python3 bench/gateway/refusals.py 127.0.0.1:18290 --valid "$N"
