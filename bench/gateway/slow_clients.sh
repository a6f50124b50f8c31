#!/usr/bin/env bash
# Hostile clients beside real users (issue "The data plane on real traffic"):
# 200 slowloris connections and 60 slow-body clients against a gateway with
# max_concurrent = 50, real users' latency (wrk, 4 connections) with and
# without them, alternated twice in one run. Backend: nginx answering a
# fixed JSON body. Default client timeouts (header 10 s, body 30 s).
# Needs: nginx, wrk, python3, a release build of rollgate.
# Usage: bench/gateway/slow_clients.sh [seconds-per-cell]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-10}
ROLLGATE=target/release/rollgate
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx wrk python3; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done
W=$(mktemp -d /tmp/rollgate-slow.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
. bench/gateway/lib.sh
ulimit -n 65536 2>/dev/null || true
start_backend_and_gateway "$W" 18181 18190 $'[limits]\nmax_concurrent = 50'
echo "# $(date -u +%FT%TZ) $(nproc) cores; bench/gateway/slow_clients.sh $SECS"
python3 bench/gateway/slow_clients.py 127.0.0.1:18190 --seconds "$SECS"
