#!/usr/bin/env bash
# Starts MLServer (from PyPI, pinned in requirements.txt) on 127.0.0.1 with
# three tiny scikit-learn models (champion, retrained, broken), for the e2e
# tests. Prints shell assignments to eval:
#   export ROLLGATE_MLSERVER_URL=http://127.0.0.1:PORT  ROLLGATE_MLSERVER_PID=PID
#   export ROLLGATE_MLSERVER_METRICS_URL=http://127.0.0.1:PORT/metrics
#   export ROLLGATE_MLSERVER_GRPC_URL=http://127.0.0.1:PORT   (its gRPC endpoint)
# The venv is kept in target/mlserver-venv (reused when its pins match).
# Stop it with: kill "$ROLLGATE_MLSERVER_PID".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/mlserver-venv"
# shellcheck source=../support/venv.sh
. "$root/tests/support/venv.sh"
ensure_venv "$here/requirements.txt" "$venv"
work="$(mktemp -d /tmp/rollgate-mlserver.XXXX)"
"$venv/bin/python" "$here/train.py" "$work/models" >&2
port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=$(port); grpc=$(port); metrics=$(port)
cat > "$work/models/settings.json" <<JSON
{"host": "127.0.0.1", "http_port": $http, "grpc_port": $grpc, "metrics_port": $metrics,
 "parallel_workers": 0, "debug": false}
JSON
(cd "$work/models" && exec "$venv/bin/mlserver" start . >"$work/mlserver.log" 2>&1) &
pid=$!
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$http/v2/models/champion/ready" >/dev/null 2>&1 \
    && curl -sf "http://127.0.0.1:$http/v2/models/broken/ready" >/dev/null 2>&1 \
    && curl -sf "http://127.0.0.1:$http/v2/models/retrained/ready" >/dev/null 2>&1; then
    echo "export ROLLGATE_MLSERVER_URL=http://127.0.0.1:$http"
    echo "export ROLLGATE_MLSERVER_METRICS_URL=http://127.0.0.1:$metrics/metrics"
    echo "export ROLLGATE_MLSERVER_GRPC_URL=http://127.0.0.1:$grpc"
    echo "export ROLLGATE_MLSERVER_PID=$pid"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.1
done
echo "MLServer did not become ready; its log:" >&2
cat "$work/mlserver.log" >&2
kill "$pid" 2>/dev/null || true
exit 1
