# What the gateway benchmarks share (sourced, not run).

# A CA and a certificate for localhost and 127.0.0.1 in $1:
# ca.pem, server.crt, server.key.
make_certs() {
  local d=$1
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=bench CA" -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$d/san.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/san.ext" -out "$d/server.crt" 2>/dev/null
}

# Waits (up to 10 s each, or $WAIT_TENTHS tenths of a second) until every
# port given listens on 127.0.0.1; fails naming the first that does not.
wait_ports() {
  local port up
  for port in "$@"; do
    up=no
    for _ in $(seq 1 "${WAIT_TENTHS:-100}"); do
      (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && { up=yes; break; }
      sleep 0.1
    done
    [ $up = yes ] || { echo "nothing listens on $port"; return 1; }
  done
}

# wrk's script in $1: POST a prediction with a key cycling over 100,000.
write_post_lua() {
  cat > "$1" <<'LUA'
wrk.method = "POST"
wrk.body = '{"instances":[[1.0,2.0,3.0]]}'
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  wrk.headers["x-rollgate-key"] = "user-" .. (n % 100000)
  return wrk.format(nil, "/v1/models/m:predict")
end
LUA
}

# wrk's latency (123.45us, 1.23ms, 1.00s) in microseconds.
to_us() {
  awk -v v="$1" 'BEGIN { if (v ~ /us$/) { sub(/us$/,"",v); print v+0 } else if (v ~ /ms$/) { sub(/ms$/,"",v); print v*1000 } else { sub(/s$/,"",v); print v*1000000 } }'
}

# In work dir $1: nginx answering a fixed prediction on 127.0.0.1:$2, and
# rollgate's gateway ($ROLLGATE, one thread) on 127.0.0.1:$3 routing model
# m to it, with "$4" (TOML) in its config before the model; their PIDs are
# appended to PIDS. Returns once the gateway answers /healthz.
start_backend_and_gateway() {
  local w=$1 backend=$2 gw=$3 extra=${4:-}
  mkdir -p "$w/logs"
  cat > "$w/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $w/nginx.pid; error_log $w/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$backend; location / { default_type application/json; return 200 '{"predictions":[[0.1,0.9]]}'; } } }
CONF
  nginx -p "$w" -c "$w/nginx.conf" & PIDS+=($!)
  printf 'listen = "127.0.0.1:%s"\n%s\n[[models]]\nname = "m"\nchampion = { revision = "champ", url = "http://127.0.0.1:%s" }\n' \
    "$gw" "$extra" "$backend" > "$w/gw.toml"
  "$ROLLGATE" gateway --config "$w/gw.toml" --threads 1 >"$w/gw.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$gw/healthz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "the gateway did not start: $w/gw.log"; return 1
}
