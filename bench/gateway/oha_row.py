#!/usr/bin/env python3
"""One TSV row from an oha JSON result: label, conns, rate, req/s, p50 us, p99 us, non-200."""
import json, sys

d = json.load(open(sys.argv[1]))
lp = d["latencyPercentiles"]
codes = d.get("statusCodeDistribution", {})
bad = sum(v for k, v in codes.items() if k != "200")
print("\t".join([sys.argv[2], sys.argv[3], sys.argv[4], "%.0f" % d["summary"]["requestsPerSec"],
                 "%.0f" % (lp["p50"] * 1e6), "%.0f" % (lp["p99"] * 1e6), str(bad)]))
