#!/usr/bin/env bash
# What TLS on both sides costs the gateway, side by side in one run:
#   rollgate plain          client --http--> gateway --http--> backend
#   rollgate TLS both sides client --https-> gateway --https-> backend (h2 upstream by ALPN)
#   nginx plain / nginx TLS both sides (the same two paths through nginx, for reference)
# wrk is pinned to core 1 (keep-alive connections: one handshake each);
# the nginx backends and every proxy share core 0, one worker each. The
# cost per request is the proxy's own CPU time (utime + stime from
# /proc/PID/stat, read before and after each cell) over the requests wrk
# completed: core-µs per request, comparable within the run.
# Needs: nginx (with ssl), wrk, openssl, and a release build of rollgate.
# Usage: bench/gateway/tls.sh [seconds-per-cell]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/gateway/lib.sh
SECS=${1:-10}
ROLLGATE=target/release/rollgate
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx wrk openssl taskset; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done

W=$(mktemp -d /tmp/rollgate-tls-bench.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

make_certs "$W"

ANSWER='{"predictions":[[0.1,0.9]]}'

# --- backends: nginx answering a fixed JSON body, plain and TLS -------------
mkdir -p "$W/backend/logs"
cat > "$W/backend/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/backend/nginx.pid; error_log $W/backend/logs/error.log crit;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:18181; location / { default_type application/json; return 200 '$ANSWER'; } }
  server {
    listen 127.0.0.1:18182 ssl http2;
    ssl_certificate $W/server.crt; ssl_certificate_key $W/server.key;
    location / { default_type application/json; return 200 '$ANSWER'; }
  }
}
CONF
taskset -c 0 nginx -p "$W/backend" -c "$W/backend/nginx.conf" & PIDS+=($!)

# --- rollgate: plain, and TLS on both sides ---------------------------------
cat > "$W/plain.toml" <<CONF
listen = "127.0.0.1:18190"
[limits]
max_concurrent = 100000
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18181" }
CONF
cat > "$W/tls.toml" <<CONF
listen = "127.0.0.1:18191"
[limits]
max_concurrent = 100000
[tls]
cert_file = "$W/server.crt"
key_file = "$W/server.key"
[upstream_tls]
ca_file = "$W/ca.pem"
[[models]]
name = "m"
champion = { revision = "champ", url = "https://localhost:18182" }
CONF
taskset -c 0 "$ROLLGATE" gateway --config "$W/plain.toml" --threads 1 >"$W/plain.log" 2>&1 & PIDS+=($!)
PLAIN_PID=$!
taskset -c 0 "$ROLLGATE" gateway --config "$W/tls.toml" --threads 1 >"$W/tls.log" 2>&1 & PIDS+=($!)
TLS_PID=$!

# --- nginx: the same two paths ----------------------------------------------
mkdir -p "$W/front/logs"
cat > "$W/front/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/front/nginx.pid; error_log $W/front/logs/error.log crit;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 1000000;
  upstream plain { server 127.0.0.1:18181; keepalive 256; }
  upstream secure { server 127.0.0.1:18182; keepalive 256; }
  server {
    listen 127.0.0.1:18193;
    location / { proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://plain; }
  }
  server {
    listen 127.0.0.1:18194 ssl;
    ssl_certificate $W/server.crt; ssl_certificate_key $W/server.key;
    location / {
      proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_ssl_trusted_certificate $W/ca.pem; proxy_ssl_verify on; proxy_ssl_name localhost;
      proxy_ssl_session_reuse on;
      proxy_pass https://secure;
    }
  }
}
CONF
taskset -c 0 nginx -p "$W/front" -c "$W/front/nginx.conf" & PIDS+=($!)
FRONT_PID=$!

wait_ports 18181 18182 18190 18191 18193 18194
# nginx's worker is the child of the master we started.
front_worker() { pgrep -P "$FRONT_PID" | head -1; }

write_post_lua "$W/post.lua"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)
RESULTS="$W/tls.tsv"
printf 'setup\tconns\treq_per_s\tp50_us\tp99_us\tnon_2xx\tcore_us_per_req\n' > "$RESULTS"
run() { # label url conns pid
  local before after out rps p50 p99 non2xx reqs
  before=$(ticks "$4")
  out=$(taskset -c 1 wrk -t1 -c"$3" -d"${SECS}s" --latency -s "$W/post.lua" "$2" 2>&1)
  after=$(ticks "$4")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  p50=$(to_us "$(awk '$1=="50%" {print $2}' <<<"$out")")
  p99=$(to_us "$(awk '$1=="99%" {print $2}' <<<"$out")")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out"); non2xx=${non2xx:-0}
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$1" "$3" "$rps" "$p50" "$p99" "$non2xx" \
    "$(awk -v t=$((after - before)) -v hz="$TCK" -v n="$reqs" 'BEGIN { print t * 1e6 / hz / n }')" | tee -a "$RESULTS"
  # A cell of errors measures nothing.
  [ "$non2xx" = "0" ] || { echo "$1: $non2xx answers were not 2xx"; exit 1; }
}

# Warm up (handshakes, pools), then alternate the cells.
taskset -c 1 wrk -t1 -c16 -d2s -s "$W/post.lua" "https://127.0.0.1:18191" >/dev/null 2>&1 || true
for c in 16 64; do
  run rollgate_plain "http://127.0.0.1:18190" $c $PLAIN_PID
  run rollgate_tls_both "https://127.0.0.1:18191" $c $TLS_PID
  run nginx_plain "http://127.0.0.1:18193" $c "$(front_worker)"
  run nginx_tls_both "https://127.0.0.1:18194" $c "$(front_worker)"
done
# Every rollgate TLS request reached the backend and was measured:
curl -s --cacert "$W/ca.pem" https://localhost:18191/rollgate/stats > "$W/tls-stats.json" || true
cp "$RESULTS" bench/results/gateway-tls.tsv
echo "raw results: bench/results/gateway-tls.tsv"
