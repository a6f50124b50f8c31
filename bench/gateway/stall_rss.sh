#!/usr/bin/env bash
# Gateway memory when the shadow stalls under load: the shadow accepts
# connections and never answers; every request is mirrored. Samples the
# gateway's RSS every 0.5 s during a wrk run at c=64 and reports the peak.
# Usage: bench/gateway/stall_rss.sh [seconds] [max_outstanding]   (default 20, 1024)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-20}
SLOTS=${2:-1024}
ROLLGATE=target/release/rollgate
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
W=$(mktemp -d /tmp/rollgate-stall.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

mkdir -p "$W/backend/logs"
cat > "$W/backend/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/backend/nginx.pid; error_log $W/backend/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:18181; location / { default_type application/json; return 200 '{"predictions":[[0.1,0.9]]}'; } } }
CONF
taskset -c 0 nginx -p "$W/backend" -c "$W/backend/nginx.conf" & PIDS+=($!)

# The black-hole shadow: accepts, reads, never answers.
python3 - <<'PY' & PIDS+=($!)
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 18199)); s.listen(4096)
held = []
while True:
    c, _ = s.accept(); held.append(c)
PY

cat > "$W/gw.toml" <<CONF
listen = "127.0.0.1:18190"
[limits]
max_concurrent = 100000
upstream_timeout = "60s"
[mirror]
max_outstanding = $SLOTS
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18181" }
shadow = { revision = "shadow", url = "http://127.0.0.1:18199", mirror_bp = 10000 }
CONF
taskset -c 0 "$ROLLGATE" gateway --config "$W/gw.toml" --threads 1 >"$W/gw.log" 2>&1 & GW=$!; PIDS+=($GW)
for port in 18181 18199 18190; do
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done
cat > "$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"instances":[[1.0,2.0,3.0]]}'
wrk.headers["Content-Type"] = "application/json"
LUA
rss() { awk '/^VmRSS/ {print $2}' /proc/$GW/status; }
before=$(rss)
peak=$before
taskset -c 1 wrk -t1 -c64 -d"${SECS}s" --latency -s "$W/post.lua" "http://127.0.0.1:18190/v1/models/m:predict" > "$W/wrk.txt" 2>&1 & WRK=$!
while kill -0 $WRK 2>/dev/null; do
  r=$(rss); [ "$r" -gt "$peak" ] && peak=$r
  sleep 0.5
done
after=$(rss)
rps=$(awk '/^Requests\/sec/ {print $2}' "$W/wrk.txt")
p99=$(awk '$1=="99%" {print $2}' "$W/wrk.txt")
drops=$(curl -s http://127.0.0.1:18190/rollgate/stats | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["models"]["m"]["pairs"].get("shadow",{}).get("mirror_dropped",0))')
printf 'max_outstanding\t%s\nrss_before_kb\t%s\nrss_peak_kb\t%s\nrss_after_kb\t%s\nrequests_per_s\t%s\np99\t%s\nmirror_dropped\t%s\n' \
  "$SLOTS" "$before" "$peak" "$after" "$rps" "$p99" "$drops" | tee bench/results/gateway-stall-rss.tsv
