#!/usr/bin/env bash
# The API server of tests/k8s/start.sh: ctl.sh start|stop|restart-api DIR.
# start: etcd, then the API server, waiting (bounded) until it is ready;
# stop: both, by their PIDs; restart-api: the API server alone (etcd keeps
# everything), as a test that restarts it mid-rollout needs.
set -euo pipefail
cmd="$1"; dir="$2"
# shellcheck disable=SC1091
source "$dir/env"
start_etcd() {
  "$bin/etcd" --data-dir "$dir/etcd" --name default \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "default=http://127.0.0.1:$peer_port" --log-level error >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
}
start_api() {
  "$bin/crd-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" --bind-address 127.0.0.1 \
    --secure-port "$api_port" --cert-dir "$dir/certs" --enable-priority-and-fairness=false \
    >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  for _ in $(seq 300); do
    if [ "$(curl -sk --max-time 2 "https://127.0.0.1:$api_port/readyz" 2>/dev/null)" = ok ]; then return 0; fi
    if ! kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "the API server did not become ready:" >&2; tail -20 "$dir/apiserver.log" >&2; return 1
}
stop_pid() {
  [ -f "$dir/$1.pid" ] || return 0
  pid="$(cat "$dir/$1.pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/$1.pid"
}
case "$cmd" in
  start) start_etcd; start_api || { stop_pid apiserver; stop_pid etcd; exit 1; } ;;
  restart-api) stop_pid apiserver; start_api ;;
  stop) stop_pid apiserver; stop_pid etcd; rm -rf "$dir" ;;
  *) echo "ctl.sh start|stop|restart-api DIR" >&2; exit 2 ;;
esac
