#!/usr/bin/env python3
"""How often a real `rollgate up` looks at each of N live rollouts.

Starts two `rollgate serve` model servers and one `rollgate up` (SQLite,
`tick = "1s"`) on 127.0.0.1, registers N models each with a champion, a
candidate and an active rollout (steps [50], no SHADOW, no traffic: every
look is a WAIT), lets them settle, then over a window reads every
rollout's `state.evaluations` from `GET /api/v1/rollouts?active=true` at
the start and the end: a rollout's look interval is the window over the
looks it got. Also the CPU (user + system) and RSS of `up` over the
window, and the audit log's growth.

    python3 bench/controller/cadence.py --rollgate target/release/rollgate \
        --models 1000 --window 60

Prints one Markdown row. Every process it starts is stopped by its PID.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=60):
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"nothing listens on {port} after {limit} s")


class Api:
    def __init__(self, port):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body)
        headers = {"content-type": "application/json"} if data else {}
        for attempt in range(3):
            try:
                self.conn.request(method, path, data, headers)
                r = self.conn.getresponse()
                text = r.read()
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt == 2:
                    raise
        if r.status >= 300:
            sys.exit(f"{method} {path}: {r.status} {text[:300]!r}")
        return json.loads(text) if text else None


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def evaluations(api):
    """Every active rollout's looks so far, page by page (newest first)."""
    out, before = {}, ""
    while True:
        page = api.call("GET", f"/api/v1/rollouts?active=true&limit=1000{before}")
        out.update({r["id"]: r["evaluations"] for r in page})
        if len(page) < 1000:
            return out
        before = f"&before={page[-1]['id']}"


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * q))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollgate", default="target/release/rollgate")
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument("--tick", default="1s")
    args = ap.parse_args()
    rollgate = os.path.abspath(args.rollgate)
    procs = []
    with tempfile.TemporaryDirectory() as d:
        try:
            subprocess.run([rollgate, "train", "--out", f"{d}/zoo"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            model_file = sorted(os.listdir(f"{d}/zoo"))[0]
            upstreams = []
            for _ in range(2):
                port = free_port()
                procs.append(subprocess.Popen(
                    [rollgate, "serve", "--model", f"{d}/zoo/{model_file}",
                     "--listen", f"127.0.0.1:{port}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                wait_port(port)
                upstreams.append(f"http://127.0.0.1:{port}")
            api_port, gw_port = free_port(), free_port()
            with open(f"{d}/up.toml", "w") as f:
                f.write(f'[api]\nlisten = "127.0.0.1:{api_port}"\n'
                        f'[controller]\ntick = "{args.tick}"\n'
                        f'[gateway]\nlisten = "127.0.0.1:{gw_port}"\n')
            log = open(os.environ.get("CADENCE_LOG", f"{d}/up.log"), "w")
            up = subprocess.Popen([rollgate, "up", "--data", f"{d}/data", "--config", f"{d}/up.toml"],
                                  stdout=log, stderr=log)
            procs.append(up)
            wait_port(api_port)
            api = Api(api_port)
            plan = {"steps": [50], "min_stage_duration": "1h", "evidence_timeout": "2h",
                    "readiness_timeout": "2h"}
            started = time.time()
            for i in range(args.models):
                name = f"m{i}"
                api.call("POST", "/api/v1/models", {"name": name, "spec": {"protocol": "kserve_v1"}})
                revs = []
                for up_url in upstreams:
                    rev = api.call("POST", f"/api/v1/models/{name}/revisions",
                                   {"upstream": up_url, "served_name": "fraud"})
                    revs.append(rev["id"])
                api.call("PUT", f"/api/v1/models/{name}/champion",
                         {"revision": revs[0], "reason": "bench"})
                api.call("POST", "/api/v1/rollouts", {"model": name, "revision": revs[1], "plan": plan})
            setup = time.time() - started
            time.sleep(args.settle)
            audit_before = os.path.getsize(f"{d}/data/rollgate.db") if os.path.exists(f"{d}/data/rollgate.db") else 0
            e0, c0, t0 = evaluations(api), cpu_seconds(up.pid), time.time()
            time.sleep(args.window)
            e1, c1, t1 = evaluations(api), cpu_seconds(up.pid), time.time()
            rss = rss_mib(up.pid)
            audit_after = os.path.getsize(f"{d}/data/rollgate.db") if os.path.exists(f"{d}/data/rollgate.db") else 0
            window = t1 - t0
            looks = [e1[i] - e0[i] for i in e0 if i in e1]
            if len(looks) < args.models:
                print(f"only {len(looks)} of {args.models} rollouts still active", file=sys.stderr)
            intervals = [window / max(n, 1e-9) for n in looks]
            print("| rollouts | window s | looks per rollout p50 | look interval p50 s | p99 s | max s "
                  "| up CPU (% of a core) | up RSS MiB | database growth KiB/h | setup s |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            print(f"| {args.models} | {window:.0f} | {quantile(looks, 0.5)} | "
                  f"{quantile(intervals, 0.5):.2f} | {quantile(intervals, 0.99):.2f} | "
                  f"{max(intervals):.2f} | {100 * (c1 - c0) / window:.0f} | {rss:.0f} | "
                  f"{(audit_after - audit_before) / 1024 * 3600 / window:.0f} | {setup:.0f} |")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
