#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a number that does
# not depend on the machine's load, so a regression on the request path
# shows up in a run on a busy shared machine.
#   plain | split 90/10 | split 90/10 + 100% shadow with pairing | TLS both sides
# Each gateway runs alone under `valgrind --tool=callgrind` (one worker
# thread); a warm-up of 300 requests fills pools and caches, the counters
# are zeroed, then N requests are sent on one keep-alive connection by a
# small Python client (not under valgrind) and the counters dumped. The
# count covers every thread of the gateway (mirrors and pairing included).
# Needs: valgrind, nginx (with ssl), openssl, python3, a release build.
# Usage: bench/gateway/callgrind.sh [requests]   (default 2000)
# ROLLGATE=path/to/rollgate and NAME=gateway-callgrind-x compare another
# build (results in bench/results/NAME.tsv); FLOOR=1 adds the floor
# (bare_proxy, see floor.sh); LABELS=1 adds answers recorded for labels.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/gateway/lib.sh
N=${1:-2000}
ROLLGATE=${ROLLGATE:-target/release/rollgate}
NAME=${NAME:-gateway-callgrind}
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in valgrind callgrind_control nginx openssl python3; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done

W=$(mktemp -d /tmp/rollgate-callgrind.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

make_certs "$W"

ANSWER='{"predictions":[[0.1,0.9]]}'
mkdir -p "$W/backend/logs"
cat > "$W/backend/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $W/backend/nginx.pid; error_log $W/backend/logs/error.log crit;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:18281; location / { default_type application/json; return 200 '$ANSWER'; } }
  server { listen 127.0.0.1:18282; location / { default_type application/json; return 200 '$ANSWER'; } }
  server {
    listen 127.0.0.1:18283 ssl http2;
    ssl_certificate $W/server.crt; ssl_certificate_key $W/server.key;
    location / { default_type application/json; return 200 '$ANSWER'; }
  }
}
CONF
nginx -p "$W/backend" -c "$W/backend/nginx.conf" & PIDS+=($!)
wait_ports 18281 18282 18283

cat > "$W/client.py" <<'PY'
import http.client, ssl, sys
host, port, n, scheme = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if scheme == "https":
    ctx = ssl.create_default_context(cafile=sys.argv[5])
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=60)
else:
    conn = http.client.HTTPConnection(host, port, timeout=60)
body = b'{"instances":[[1.0,2.0,3.0]]}'
bad = 0
for i in range(n):
    conn.request("POST", "/v1/models/m:predict", body,
                 {"content-type": "application/json", "x-rollgate-key": "user-%d" % i})
    r = conn.getresponse()
    r.read()
    bad += r.status != 200
print(bad)
PY

RESULTS="$W/callgrind.tsv"
printf 'setup\trequests\tinstructions\tinstructions_per_request\n' > "$RESULTS"
cell() { # label port scheme route-toml [extra-toml]
  local cfg="$W/$1.toml"
  cat > "$cfg" <<CONF
listen = "127.0.0.1:$2"
${5:-}
[[models]]
name = "m"
$4
CONF
  measure "$1" "$2" "$3" "$ROLLGATE" gateway --config "$cfg" --threads 1
}
measure() { # label port scheme command...
  local out="$W/$1.callgrind"
  valgrind --tool=callgrind --callgrind-out-file="$out" "${@:4}" >"$W/$1.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  WAIT_TENTHS=600 wait_ports "$2" # valgrind starts slowly
  python3 "$W/client.py" 127.0.0.1 "$2" 300 "$3" "$W/ca.pem" >/dev/null
  sleep 1 # mirrors of the warm-up finish
  callgrind_control --zero "$pid" >/dev/null
  local bad; bad=$(python3 "$W/client.py" 127.0.0.1 "$2" "$N" "$3" "$W/ca.pem")
  sleep 1 # mirrors and pairing of the last requests finish
  callgrind_control --dump="$1" "$pid" >/dev/null
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  [ "$bad" = "0" ] || { echo "$1: $bad requests were not 200"; exit 1; }
  # The dump made after zeroing: the file with the highest part number.
  local dump; dump=$(ls "$out".* 2>/dev/null | sort -t. -k3 -n | tail -1)
  local ir; ir=$(awk '/^summary:/ {print $2}' "$dump")
  printf '%s\t%s\t%s\t%.0f\n' "$1" "$N" "$ir" "$(awk -v i="$ir" -v n="$N" 'BEGIN { print i / n }')" | tee -a "$RESULTS"
  cp "$dump" "$W/$1.last.callgrind"
}
cell plain 18290 http 'champion = { revision = "champ", url = "http://127.0.0.1:18281" }'
cell split 18291 http 'champion = { revision = "champ", url = "http://127.0.0.1:18281" }
candidate = { revision = "cand", url = "http://127.0.0.1:18282", weight_bp = 1000 }'
cell split_shadow 18292 http 'champion = { revision = "champ", url = "http://127.0.0.1:18281" }
candidate = { revision = "cand", url = "http://127.0.0.1:18282", weight_bp = 1000 }
shadow = { revision = "shadow", url = "http://127.0.0.1:18282", mirror_bp = 10000 }'
# LABELS=1: the split with a shadow, for a rollout judged on labels: each
# arm's answer also recorded under the request's id (a build that knows
# `record_answers`; with no store follower the queue fills, then drops
# its oldest, as it would with the store away).
if [ -n "${LABELS:-}" ]; then
  cell split_shadow_labels 18296 http 'champion = { revision = "champ", url = "http://127.0.0.1:18281" }
candidate = { revision = "cand", url = "http://127.0.0.1:18282", weight_bp = 1000 }
shadow = { revision = "shadow", url = "http://127.0.0.1:18282", mirror_bp = 10000 }
epoch = "1.1"
record_answers = true'
fi
cell tls_both 18293 https 'champion = { revision = "champ", url = "https://localhost:18283" }' "[tls]
cert_file = \"$W/server.crt\"
key_file = \"$W/server.key\"
[upstream_tls]
ca_file = \"$W/ca.pem\""
# The floor (FLOOR=1): the same stack doing nothing
# (crates/rollgate-gateway/examples/bare_proxy.rs), and with the parts of
# the request path that are not measurement (--like-gateway).
if [ -n "${FLOOR:-}" ]; then
  BARE=target/release/examples/bare_proxy
  [ -x "$BARE" ] || cargo build --release -p rollgate-gateway --example bare_proxy
  measure bare_proxy 18294 http "$BARE" 127.0.0.1:18294 127.0.0.1:18281
  measure bare_proxy_like_gateway 18295 http "$BARE" 127.0.0.1:18295 127.0.0.1:18281 --like-gateway
fi
cp "$RESULTS" "bench/results/$NAME.tsv"
# Where the instructions go (plain, inclusive of callees), for whoever looks
# for the next saving:
callgrind_annotate --inclusive=yes "$W/plain.last.callgrind" 2>/dev/null \
  | sed -n '/^Ir/,$p' | head -120 | cut -c1-200 > "bench/results/$NAME-plain-top.txt" || true
echo "raw results: bench/results/$NAME.tsv"
