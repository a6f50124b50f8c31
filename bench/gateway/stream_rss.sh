#!/usr/bin/env bash
# Gateway memory with large payloads: 16 clients at once download a 32 MiB
# answer and upload a 32 MiB request through a `json` model (output not
# read, no shadow), first with limits above the payload (held whole, as
# every body was before streaming), then with 1 MiB limits (beyond them,
# streamed). Peak RSS of the gateway from /proc/PID/status (VmHWM), and
# whether every byte arrived.
# Needs: nginx, curl, python3, a release build.
# Usage: bench/gateway/stream_rss.sh [MiB] [clients]   (default 32, 16)
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/gateway/lib.sh
MIB=${1:-32}
CLIENTS=${2:-16}
ROLLGATE=${ROLLGATE:-target/release/rollgate}
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
W=$(mktemp -d /tmp/rollgate-stream.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The model server: nginx answers GET and POST /score with the big file
# (a POST's body is read and discarded), /upload with a small answer.
mkdir -p "$W/backend/logs" "$W/www"
head -c $((MIB << 20)) /dev/urandom > "$W/www/big"
chmod 755 "$W" "$W/www"; chmod 644 "$W/www/big" # nginx's workers read it
cat > "$W/backend/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/backend/nginx.pid; error_log $W/backend/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; client_max_body_size 0; client_body_buffer_size 1m;
  server { listen 127.0.0.1:18481;
    location = /score { alias $W/www/big; error_page 405 =200 \$uri; }
    location = /upload { client_body_temp_path $W/backend/tmp; return 200 '{"ok":true}'; }
  } }
CONF
mkdir -p "$W/backend/tmp"
nginx -p "$W/backend" -c "$W/backend/nginx.conf" & PIDS+=($!)
wait_ports 18481

run() { # $1 label, $2 limit bytes
  local port=18490
  cat > "$W/gw.toml" <<CONF
listen = "127.0.0.1:$port"
[limits]
max_body_bytes = $2
max_response_bytes = $2
upstream_timeout = "120s"
[[models]]
name = "big"
protocol = "json"
json_path = "/score"
champion = { revision = "champ", url = "http://127.0.0.1:18481" }
[[models]]
name = "up"
protocol = "json"
json_path = "/upload"
champion = { revision = "champ", url = "http://127.0.0.1:18481" }
CONF
  "$ROLLGATE" gateway --config "$W/gw.toml" >"$W/gw-$1.log" 2>&1 & local gw=$!; PIDS+=($gw)
  wait_ports $port
  local base; base=$(awk '/^VmHWM/ {print $2}' /proc/$gw/status)
  local ok=0 clients=()
  for i in $(seq 1 "$CLIENTS"); do
    curl -s -m 120 -X POST --data-binary '{}' -o "$W/out-$i" "http://127.0.0.1:$port/score" & clients+=($!)
    curl -s -m 120 -X POST --data-binary @"$W/www/big" -o "$W/up-$i" "http://127.0.0.1:$port/upload" & clients+=($!)
  done
  wait "${clients[@]}" || true
  for i in $(seq 1 "$CLIENTS"); do
    cmp -s "$W/out-$i" "$W/www/big" && grep -q '"ok":true' "$W/up-$i" && ok=$((ok + 1))
  done
  local peak; peak=$(awk '/^VmHWM/ {print $2}' /proc/$gw/status)
  printf '%s\t%s\t%s\t%s\t%s/%s\n' "$1" "$2" "$base" "$peak" "$ok" "$CLIENTS"
  kill $gw; wait $gw 2>/dev/null || true
}

{
  printf 'mode\tlimit_bytes\trss_start_kb\trss_peak_kb\tclients_intact\n'
  run held-whole $(( (MIB + 1) << 20 ))
  run streamed $((1 << 20))
} | tee bench/results/gateway-stream-rss.tsv
