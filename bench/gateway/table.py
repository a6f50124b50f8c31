#!/usr/bin/env python3
"""Markdown tables from bench/results/gateway.tsv (wrk, closed loop) and
gateway-fixed-rate.tsv (oha, open loop): ratios to nginx split+mirror and to
direct, and p50 added over direct, computed from the same run."""
import csv, os

here = os.path.join(os.path.dirname(__file__), "..", "results")

def rows(name):
    path = os.path.join(here, name)
    if not os.path.exists(path):
        return []
    return [r for r in csv.reader(open(path), delimiter="\t") if r]

names = {
    "direct": "direct to backend",
    "rollgate_plain": "rollgate plain proxy",
    "rollgate_split_90_10": "rollgate 90/10 split",
    "rollgate_split_shadow": "**rollgate 90/10 + 100% shadow**",
    "nginx_split_mirror": "nginx split_clients + mirror",
    "haproxy_weighted": "HAProxy weighted 90/10",
}

def table(data, rate_col):
    by = {(r[0], r[1]): r for r in data}
    out = ["| setup | c | " + ("rate | " if rate_col else "") + "req/s | p50 µs | p99 µs | req/s ÷ nginx split+mirror | req/s ÷ direct | p50 − direct µs |",
           "|---|---:|" + ("---:|" if rate_col else "") + "---:|---:|---:|---:|---:|---:|"]
    for r in data:
        label, c = r[0], r[1]
        vals = r[2:] if not rate_col else r[3:]
        rps, p50, p99 = float(vals[0]), float(vals[1]), float(vals[2])
        nginx = by.get(("nginx_split_mirror", c))
        direct = by.get(("direct", c))
        nrps = float((nginx[3] if rate_col else nginx[2])) if nginx else None
        d = (direct[3:] if rate_col else direct[2:]) if direct else None
        cells = [names.get(label, label), c] + ([r[2]] if rate_col else []) + [f"{rps:,.0f}", f"{p50:,.0f}", f"{p99:,.0f}",
                 f"{rps / nrps:.2f}" if nrps and label != "direct" else "",
                 f"{rps / float(d[0]):.2f}" if d else "",
                 f"{p50 - float(d[1]):+,.0f}" if d else ""]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)

print("### Closed loop (wrk, as fast as each setup goes)\n")
print(table(rows("gateway.tsv"), False))
fr = rows("gateway-fixed-rate.tsv")
if fr:
    print("\n### Fixed rate (oha, open loop, 2,000 req/s, latency-corrected)\n")
    print(table(fr, True))
