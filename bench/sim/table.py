#!/usr/bin/env python3
"""Markdown table from bench/results/sim.json (written by `rollgate sim --json`)."""
import json, os

here = os.path.join(os.path.dirname(__file__), "..", "results")
cells = json.load(open(os.path.join(here, "sim.json")))
print("| scenario | expect | policy | promoted | breach rollbacks | starved | undecided | wrong (95% CI) | median s | median candidate requests | runs with live exposure |")
print("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|")
for c in cells:
    lo, hi = c["wrong_rate_ci"]
    med = lambda v: "-" if v is None else f"{v:,.0f}"
    print(f"| {c['scenario']} | {c['expect']} | {c['policy']} | {c['promoted']}/{c['runs']} | {c['rolled_back_breach']} | "
          f"{c['rolled_back_other']} | {c['unfinished']} | {c['wrong_rate']*100:.1f}% [{lo*100:.1f}, {hi*100:.1f}] | "
          f"{med(c['median_seconds'])} | {med(c['median_candidate_requests'])} | {c['live_exposed']} |")
