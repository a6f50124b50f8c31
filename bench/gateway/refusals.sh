#!/usr/bin/env bash
# Valid requests after the gateway's own refusals on a keep-alive
# connection (issue "The data plane keeps every connection it answers"):
# 10,000 valid predictions, each after a refused request on the same
# connection (unknown model, wrong protocol, no route; every 50th refused
# body 200 ms late). Target: 0 failures. Backend: nginx answering a fixed
# JSON body. Needs: nginx, python3, a release build of rollgate.
# Usage: bench/gateway/refusals.sh [valid-requests]   (default 10000)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-10000}
ROLLGATE=${ROLLGATE:-target/release/rollgate}
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
for t in nginx python3 curl; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done
W=$(mktemp -d /tmp/rollgate-refusals.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
. bench/gateway/lib.sh
start_backend_and_gateway "$W" 18281 18290
echo "# $(date -u +%FT%TZ) $(nproc) cores; ROLLGATE=$ROLLGATE bench/gateway/refusals.sh $N"
python3 bench/gateway/refusals.py 127.0.0.1:18290 --valid "$N"
