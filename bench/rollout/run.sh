#!/usr/bin/env bash
# End-to-end rollout benchmark: real processes over real sockets.
# For each scenario: a fresh `rollgate up` (store, gateway, controller, API),
# a champion and a candidate `rollgate serve`, `rollgate traffic` at RPS
# through the gateway, then `rollgate rollout start` and `rollout wait`.
# Every row uses bench/rollout/plan.toml.
# Usage: bench/rollout/run.sh [rps] [identical-trials]   (default 300 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
RPS=${1:-300}
TRIALS=${2:-10}
cargo build --release -p rollgate >/dev/null 2>&1
RG=$PWD/target/release/rollgate
W=$(mktemp -d /tmp/rollgate-rollout-bench.XXXX)
"$RG" train --out "$W/models" --seed 7 > "$W/zoo.txt"
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap stop_all EXIT

wait_port() { for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# scenario name, candidate model, candidate serve flags
scenario() {
  local name=$1 trial=$2 model=$3; shift 3
  local d="$W/$name-$trial"; mkdir -p "$d"
  cat > "$d/up.toml" <<CONF
[api]
listen = "127.0.0.1:17070"
[controller]
tick = "250ms"
follow_interval = "200ms"
[gateway]
listen = "127.0.0.1:18080"
CONF
  "$RG" up --config "$d/up.toml" --data "$d/data" > "$d/up.log" 2>&1 & PIDS+=($!)
  "$RG" serve --model "$W/models/champion.json" --listen 127.0.0.1:19001 > "$d/champ.log" 2>&1 & PIDS+=($!)
  "$RG" serve --model "$W/models/$model.json" --listen 127.0.0.1:19002 "$@" > "$d/cand.log" 2>&1 & PIDS+=($!)
  wait_port 17070; wait_port 18080; wait_port 19001; wait_port 19002
  export ROLLGATE_API=http://127.0.0.1:17070
  "$RG" model add fraud > /dev/null
  local champ cand
  champ=$("$RG" revision add fraud --upstream http://127.0.0.1:19001)
  cand=$("$RG" revision add fraud --upstream http://127.0.0.1:19002 --artifact "$model")
  "$RG" champion set fraud "$champ" --reason bench > /dev/null
  "$RG" traffic --url http://127.0.0.1:18080 --rps "$RPS" --duration 240 --seed "$trial" --json > "$d/traffic.json" & local tp=$!; PIDS+=($tp)
  sleep 2
  local t0; t0=$(date +%s%N)
  "$RG" rollout start fraud "$cand" --plan bench/rollout/plan.toml > /dev/null
  set +e; "$RG" rollout wait 1 --timeout 4m > "$d/wait.txt"; local rc=$?; set -e
  local t1; t1=$(date +%s%N)
  "$RG" rollout status 1 --output json > "$d/status.json"
  "$RG" audit --rollout 1 --format json > "$d/audit.jsonl"
  "$RG" audit verify > "$d/verify.json" || true
  printf '{"scenario":"%s","trial":%s,"exit":%s,"wall_s":%s}\n' "$name" "$trial" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" > "$d/row.json"
  echo "$name #$trial: exit $rc $(cat "$d/wait.txt")"
  stop_all
  sleep 0.5
}

for t in $(seq 1 "$TRIALS"); do scenario identical "$t" champion; done
for t in 1 2 3; do scenario retrained "$t" retrained; done
scenario broken-feature 1 broken-feature
scenario failing-50pct 1 champion --failure-rate 0.5
scenario ready-then-503 1 champion --ready-then-503
scenario latency-plus-100ms 1 champion --latency-ms 100

python3 bench/rollout/summarize.py "$W" "$RPS"
