#!/usr/bin/env python3
"""Summarises a bench/rollout/run.sh work directory into
bench/results/rollout.{json,md,svg}. Reads only what the run wrote: each
scenario's rollout status and audit log (standard library only)."""
import glob, json, os, statistics, sys

work, rps = sys.argv[1], sys.argv[2]
rows = []
for d in sorted(glob.glob(os.path.join(work, "*-*"))):
    if not os.path.isfile(os.path.join(d, "row.json")):
        continue
    row = json.load(open(os.path.join(d, "row.json")))
    status = json.load(open(os.path.join(d, "status.json")))
    audit = [json.loads(l) for l in open(os.path.join(d, "audit.jsonl")) if l.strip()]
    verify = json.load(open(os.path.join(d, "verify.json")))
    phase = status["state"]["phase"]
    final = next((a for a in reversed(audit) if a["kind"] in ("promoted", "rolled_back", "aborted")), None)
    created = next(a for a in audit if a["kind"] == "rollout_created")
    started = next((a for a in audit if a["kind"] == "started"), created)
    frm = final["body"]["from"] if final else {}
    stage = frm.get("phase", "?")
    if stage == "canary":
        stage = f"canary_{frm.get('weight_percent')}"
    weights = [a["body"]["to"].get("weight_percent", 0) for a in audit
               if a["kind"] in ("advanced", "started") and isinstance(a["body"].get("to"), dict)]
    row.update({
        "outcome": phase["phase"],
        "reason": (phase.get("reason") or {}).get("code"),
        "decided_at": stage,
        "seconds_to_decision": round((final["at"] - started["at"]) / 1000.0, 2) if final else None,
        "max_live_weight_percent": max(weights + [0]),
        "evaluations": status["state"]["evaluations"],
        "audit_records": len(audit),
        "audit_chain_intact": verify.get("first_break") is None,
        "traffic": json.load(open(os.path.join(d, "traffic.json"))) if os.path.getsize(os.path.join(d, "traffic.json")) else None,
    })
    rows.append(row)

out = os.path.join(os.path.dirname(__file__), "..", "results")
json.dump({"rps": float(rps), "rows": rows}, open(os.path.join(out, "rollout.json"), "w"), indent=1)

order = ["identical", "retrained", "broken-feature", "failing-50pct", "ready-then-503", "latency-plus-100ms"]
lines = [f"| scenario | trials | outcome | decided at | seconds to decision (median, min–max) | max live weight | audit chains intact |",
         "|---|---:|---|---|---:|---:|---|"]
summary = []
for name in order:
    rs = [r for r in rows if r["scenario"] == name]
    if not rs:
        continue
    outcomes = {}
    for r in rs:
        key = r["outcome"] + (f" ({r['reason']})" if r["reason"] else "")
        outcomes[key] = outcomes.get(key, 0) + 1
    secs = [r["seconds_to_decision"] for r in rs if r["seconds_to_decision"] is not None]
    stages = sorted({r["decided_at"] for r in rs})
    med = statistics.median(secs) if secs else None
    summary.append((name, med))
    lines.append(f"| {name} | {len(rs)} | " + ", ".join(f"{v}/{len(rs)} {k}" for k, v in outcomes.items())
                 + f" | {', '.join(stages)} | {med:.1f} ({min(secs):.1f}–{max(secs):.1f}) | {max(r['max_live_weight_percent'] for r in rs)}% | "
                 + f"{sum(r['audit_chain_intact'] for r in rs)}/{len(rs)} |")
open(os.path.join(out, "rollout-table.md"), "w").write("\n".join(lines) + "\n")

# A horizontal bar chart of the median time to decision, as plain SVG.
w, bar_h, left = 640, 26, 170
h = 40 + bar_h * len(summary) + 30
top = max((m or 0) for _, m in summary) or 1
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
       f'<text x="10" y="20" font-size="14">Median time to decision at {float(rps):.0f} rps (seconds)</text>']
for i, (name, med) in enumerate(summary):
    y = 40 + i * bar_h
    bw = (w - left - 80) * (med or 0) / top
    color = "#16a34a" if name in ("identical", "retrained") else "#dc2626"
    svg.append(f'<text x="10" y="{y + 16}">{name}</text>')
    svg.append(f'<rect x="{left}" y="{y + 4}" width="{bw:.1f}" height="{bar_h - 8}" fill="{color}"/>')
    svg.append(f'<text x="{left + bw + 6:.1f}" y="{y + 16}">{(med or 0):.1f}s</text>')
svg.append(f'<text x="10" y="{h - 8}" fill="#555">green: promoted scenarios; red: candidates that must be stopped</text></svg>')
open(os.path.join(out, "rollout.svg"), "w").write("\n".join(svg) + "\n")
print("\n".join(lines))
