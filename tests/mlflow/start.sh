#!/usr/bin/env bash
# Starts an MLflow tracking server with its model registry (from PyPI, pinned
# in requirements.txt) on 127.0.0.1, on a SQLite store in a temporary
# directory, for the registry tests. Prints shell assignments to eval:
#   export ROLLGATE_MLFLOW_URL=http://127.0.0.1:PORT  ROLLGATE_MLFLOW_PID=PID
#   export ROLLGATE_MLFLOW_DIR=DIR   (its store and log)
# The venv is kept in target/mlflow-venv (reused while its pins match).
# It runs in a process group of its own (its workers and job runners too):
# stop it with kill -- -"$ROLLGATE_MLFLOW_PID".
# With ROLLGATE_MLFLOW_PORT and ROLLGATE_MLFLOW_DIR set, it starts again on
# that port and store (a test's registry outage ends). `start.sh install`
# only installs the venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/mlflow-venv"
# shellcheck source=../support/venv.sh
. "$root/tests/support/venv.sh"
ensure_venv "$here/requirements.txt" "$venv"
if [ "${1:-}" = install ]; then exit 0; fi
work="${ROLLGATE_MLFLOW_DIR:-$(mktemp -d /tmp/rollgate-mlflow.XXXX)}"
port="${ROLLGATE_MLFLOW_PORT:-$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
# One worker: the tests are its only clients. Webhooks may call rollgate's
# controller on loopback over http (MLflow refuses both by default), and a
# webhook made is used at once (MLflow caches the list for 60 s by default).
export MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true
export MLFLOW_WEBHOOK_CACHE_TTL=1
(cd "$work" && exec setsid "$venv/bin/mlflow" server --host 127.0.0.1 --port "$port" --workers 1 \
  --backend-store-uri "sqlite:///$work/mlflow.db" --default-artifact-root "$work/artifacts" \
  >>"$work/mlflow.log" 2>&1) &
pid=$!
for _ in $(seq 1 1200); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    echo "export ROLLGATE_MLFLOW_URL=http://127.0.0.1:$port"
    echo "export ROLLGATE_MLFLOW_PID=$pid"
    echo "export ROLLGATE_MLFLOW_DIR=$work"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.1
done
echo "MLflow did not become ready within 120 s; its log:" >&2
tail -30 "$work/mlflow.log" >&2
kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
exit 1
