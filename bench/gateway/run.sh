#!/usr/bin/env bash
# Gateway overhead, side by side in one run, on the same nginx backends:
#   direct | rollgate plain | rollgate 90/10 | rollgate 90/10 + 100% shadow
#   | nginx split_clients + mirror | HAProxy weighted 90/10
# wrk is pinned to core 1; backends and every proxy share core 0, each proxy
# with one worker (nginx worker_processes 1, HAProxy nbthread 1, rollgate
# --threads 1), so rows compare like with like.
# Needs: nginx, haproxy, wrk (Debian packages), and a release build of rollgate.
# Usage: bench/gateway/run.sh [seconds-per-cell]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/gateway/lib.sh
SECS=${1:-10}
ROLLGATE=target/release/rollgate
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx haproxy wrk taskset; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done

W=$(mktemp -d /tmp/rollgate-bench.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

BODY='{"instances":[[1.0,2.0,3.0]]}'
ANSWER='{"predictions":[[0.1,0.9]]}'

# --- backends: nginx answering a fixed JSON body ---------------------------
mkdir -p "$W/backend/logs"
cat > "$W/backend/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/backend/nginx.pid; error_log $W/backend/logs/error.log crit;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:18081; location / { default_type application/json; return 200 '$ANSWER'; } }
  server { listen 127.0.0.1:18082; location / { default_type application/json; return 200 '$ANSWER'; } }
}
CONF
taskset -c 0 nginx -p "$W/backend" -c "$W/backend/nginx.conf" & PIDS+=($!)

# --- rollgate: three gateways --------------------------------------------
gw() { # name port extra-route-toml
  cat > "$W/$1.toml" <<CONF
listen = "127.0.0.1:$2"
[limits]
max_concurrent = 100000
[mirror]
max_outstanding = 1024
[[models]]
name = "m"
champion = { revision = "champ", url = "http://127.0.0.1:18081" }
$3
CONF
  taskset -c 0 "$ROLLGATE" gateway --config "$W/$1.toml" --threads 1 >"$W/$1.log" 2>&1 & PIDS+=($!)
}
gw plain 18090 ""
gw split 18091 'candidate = { revision = "cand", url = "http://127.0.0.1:18082", weight_bp = 1000 }'
gw shadow 18092 'candidate = { revision = "cand", url = "http://127.0.0.1:18082", weight_bp = 1000 }
shadow = { revision = "shadow", url = "http://127.0.0.1:18082", mirror_bp = 10000 }'

# --- nginx front: split_clients + mirror ---------------------------------
mkdir -p "$W/front/logs"
cat > "$W/front/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/front/nginx.pid; error_log $W/front/logs/error.log crit;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 1000000;
  upstream champ { server 127.0.0.1:18081; keepalive 256; }
  upstream cand  { server 127.0.0.1:18082; keepalive 256; }
  upstream shadow { server 127.0.0.1:18082; keepalive 256; }
  split_clients "\${http_x_rollgate_key}" \$arm { 10% cand; * champ; }
  server {
    listen 127.0.0.1:18093;
    location / {
      mirror /mirror; mirror_request_body on;
      proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_pass http://\$arm;
    }
    location = /mirror { internal; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://shadow\$request_uri; }
  }
}
CONF
taskset -c 0 nginx -p "$W/front" -c "$W/front/nginx.conf" & PIDS+=($!)

# --- HAProxy: weighted 90/10 ---------------------------------------------
cat > "$W/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:18094
  default_backend be
backend be
  balance roundrobin
  http-reuse always
  server champ 127.0.0.1:18081 weight 90
  server cand 127.0.0.1:18082 weight 10
CONF
taskset -c 0 haproxy -f "$W/haproxy.cfg" -db >"$W/haproxy.log" 2>&1 & PIDS+=($!)

wait_ports 18081 18082 18090 18091 18092 18093 18094

write_post_lua "$W/post.lua"

RESULTS="$W/results.tsv"
: > "$RESULTS"
run() { # label port conns
  local out; out=$(taskset -c 1 wrk -t1 -c"$3" -d"${SECS}s" --latency -s "$W/post.lua" "http://127.0.0.1:$2" 2>&1)
  local rps p50 p99 non2xx
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(to_us "$(awk '$1=="50%" {print $2}' <<<"$out")")
  p99=$(to_us "$(awk '$1=="99%" {print $2}' <<<"$out")")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out"); non2xx=${non2xx:-0}
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$3" "$rps" "$p50" "$p99" "$non2xx" | tee -a "$RESULTS"
}

# c=1: the unloaded cost of one extra hop (no queueing).
run direct 18081 1
run rollgate_plain 18090 1
run haproxy_weighted 18094 1
run nginx_split_mirror 18093 1
for c in 16 64; do
  run direct 18081 $c
  run rollgate_plain 18090 $c
  run rollgate_split_90_10 18091 $c
  run rollgate_split_shadow 18092 $c
  run nginx_split_mirror 18093 $c
  run haproxy_weighted 18094 $c
done

# Fixed rate (open loop, oha): the same proxies at 2,000 req/s, far below
# saturation, so p50 shows the cost of the hop rather than queueing on the
# shared core. `cargo install oha` provides oha; without it this part is skipped.
RATE_RESULTS="$W/rate.tsv"
: > "$RATE_RESULTS"
run_rate() { # label port conns rate
  command -v oha >/dev/null || return 0
  taskset -c 1 oha -c "$3" -q "$4" -z "${SECS}s" --latency-correction --no-tui --output-format json \
    -m POST -d '{"instances":[[1.0,2.0,3.0]]}' -H 'content-type: application/json' -H "x-rollgate-key: user-$RANDOM" \
    "http://127.0.0.1:$2/v1/models/m:predict" > "$W/oha.json"
  python3 bench/gateway/oha_row.py "$W/oha.json" "$1" "$3" "$4" | tee -a "$RATE_RESULTS"
}
for c in 16 64; do
  run_rate direct 18081 $c 2000
  run_rate rollgate_plain 18090 $c 2000
  run_rate rollgate_split_shadow 18092 $c 2000
  run_rate nginx_split_mirror 18093 $c 2000
  run_rate haproxy_weighted 18094 $c 2000
done
cp "$RATE_RESULTS" bench/results/gateway-fixed-rate.tsv

# Shadow pairs really happened (not a no-op mirror):
curl -s http://127.0.0.1:18092/rollgate/stats > "$W/shadow-stats.json" || true

cp "$RESULTS" bench/results/gateway.tsv
cp "$W/shadow-stats.json" bench/results/gateway-shadow-stats.json 2>/dev/null || true
echo "raw results: bench/results/gateway.tsv"
