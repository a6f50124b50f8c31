#!/usr/bin/env bash
# The same three rollouts through rollgate's own gateway and through nginx
# with Prometheus evidence, side by side in one run: `rollgate demo
# --quick` and `rollgate demo --quick --data-plane nginx`, alternated RUNS
# times each, and each rollout's decision and time to decision (from its
# creation to its end, as the demo prints it) tabulated. The demo's plans
# are the same for both; the Prometheus path scrapes every 1 s with a 1.5 s
# horizon.
# Needs: nginx and prometheus (Debian), python3, a release build.
# Usage: bench/data-plane/compare.sh [RUNS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5}
ROLLGATE=${ROLLGATE:-target/release/rollgate}
[ -x "$ROLLGATE" ] || cargo build --release -p rollgate
export PATH="$PATH:/usr/sbin"
W=$(mktemp -d /tmp/rollgate-dp.XXXX)
trap 'rm -rf "$W"' EXIT
OUT=bench/results/data-plane.tsv
printf 'run\tpath\trollout\tphase\tseconds\tmax_live_percent\n' > "$OUT"
for run in $(seq 1 "$RUNS"); do
    for path in gateway nginx; do
        args=(demo --quick --seed "$run" --dir "$W/$path-$run")
        [ "$path" = nginx ] && args+=(--data-plane nginx)
        "$ROLLGATE" "${args[@]}" > "$W/$path-$run.log" 2>&1 || {
            echo "run $run ($path) failed: $W/$path-$run.log" >&2; tail -20 "$W/$path-$run.log" >&2; exit 1; }
        # "  retrained       PROMOTED     after  15.3s, at most 50% of live traffic"
        sed -n '/^-- summary/,/^$/p' "$W/$path-$run.log" | awk -v run="$run" -v path="$path" '
            $3 == "after" { s = $4; sub(/s,$/, "", s); live = ($0 ~ /zero live/) ? 0 : $7; sub(/%$/, "", live);
                            printf "%s\t%s\t%s\t%s\t%s\t%s\n", run, path, $1, $2, s, live }' >> "$OUT"
    done
done
python3 - "$OUT" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("| rollout | through | decisions | median s to decision | range s |")
print("|---|---|---|---|---|")
for rollout in ["retrained", "broken-feature", "ready-then-503"]:
    for path in ["gateway", "nginx"]:
        r = [x for x in rows if x["rollout"] == rollout and x["path"] == path]
        s = sorted(float(x["seconds"]) for x in r)
        phases = ", ".join(f'{p} {sum(x["phase"] == p for x in r)}/{len(r)}' for p in sorted({x["phase"] for x in r}))
        print(f"| {rollout} | {path} | {phases} | {statistics.median(s):.1f} | {s[0]:.1f}–{s[-1]:.1f} |")
PY
