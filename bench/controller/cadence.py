#!/usr/bin/env python3
"""How often a real rollgate looks at each of N live rollouts.

Starts two `rollgate serve` model servers and one `rollgate up` (SQLite,
`tick = "1s"`) on 127.0.0.1 — or with `--store postgres` a throwaway
PostgreSQL and `rollgate controller` + `rollgate gateway` on it — registers N models each with a champion, a
candidate and an active rollout (steps [50], no SHADOW, no traffic: every
look is a WAIT), lets them settle, then over a window reads every
rollout's `state.evaluations` from `GET /api/v1/rollouts?active=true` at
the start and the end: a rollout's look interval is the window over the
looks it got. Also the CPU (user + system) and RSS of each rollgate
process over the window, and the database's growth.

    python3 bench/controller/cadence.py --rollgate target/release/rollgate \
        --models 1000 --window 60 [--store postgres]

Prints one Markdown row. Every process it starts is stopped by its PID.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import sqlite3
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


class Rollgate:
    """rollgate as a user runs it: one `rollgate up` (SQLite in its data
    directory), or with `store = "postgres"` a throwaway PostgreSQL
    (tests/postgres/start.sh) and `rollgate controller` + `rollgate
    gateway` on it. `measured` names the processes whose CPU and RSS are
    reported; `db_bytes()` the database's size."""

    def __init__(self, rollgate, d, tick, store, log_name):
        self.procs, self.pg_dir, self.d = [], None, d
        self.api_port, self.gw_port = free_port(), free_port()
        with open(f"{d}/up.toml", "w") as f:
            f.write(f'[api]\nlisten = "127.0.0.1:{self.api_port}"\n'
                    f'[controller]\ntick = "{tick}"\n'
                    f'[gateway]\nlisten = "127.0.0.1:{self.gw_port}"\n')
        log = open(os.environ.get(log_name, f"{d}/rollgate.log"), "w")
        if store == "sqlite":
            up = subprocess.Popen([rollgate, "up", "--data", f"{d}/data", "--config", f"{d}/up.toml"],
                                  stdout=log, stderr=log)
            self.procs.append(up)
            self.measured = {"up": up}
        else:
            here = os.path.dirname(os.path.abspath(__file__))
            out = subprocess.run([f"{here}/../../tests/postgres/start.sh"], check=True,
                                 capture_output=True, text=True).stdout
            env = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines()
                       if line.startswith("export "))
            self.pg_dir, self.url = env["ROLLGATE_POSTGRES_DIR"], env["ROLLGATE_TEST_POSTGRES"]
            ctl = subprocess.Popen([rollgate, "controller", "--config", f"{d}/up.toml", "--data",
                                    f"{d}/data", "--store", self.url], stdout=log, stderr=log)
            self.procs.append(ctl)
            wait_port(self.api_port)
            gw = subprocess.Popen([rollgate, "gateway", "--store", self.url, "--listen",
                                   f"127.0.0.1:{self.gw_port}", "--advertise",
                                   f"http://127.0.0.1:{self.gw_port}", "--id", "gw1"],
                                  stdout=log, stderr=log)
            self.procs.append(gw)
            self.measured = {"controller": ctl, "gateway": gw}
        wait_port(self.api_port)
        wait_port(self.gw_port)

    def db_bytes(self):
        if self.pg_dir is None:
            path = f"{self.d}/data/rollgate.db"
            return os.path.getsize(path) if os.path.exists(path) else 0
        with open(f"{self.pg_dir}/env") as f:
            bindir = next(line.split("=", 1)[1].strip() for line in f if line.startswith("bin="))
        out = subprocess.run([f"{bindir}/psql", self.url, "-Atc", "SELECT pg_database_size(current_database())"],
                             capture_output=True, text=True)
        return int(out.stdout.strip() or 0)

    def audit(self):
        """The audit log's records and bytes (every column's text)."""
        q = ("SELECT count(*), coalesce(sum(length(actor) + length(model) + length(kind) "
             "+ length(body) + length(prev_hash) + length(hash) + 24), 0) FROM audit")
        if self.pg_dir is None:
            path = f"{self.d}/data/rollgate.db"
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                return tuple(db.execute(q).fetchone())
        with open(f"{self.pg_dir}/env") as f:
            bindir = next(line.split("=", 1)[1].strip() for line in f if line.startswith("bin="))
        out = subprocess.run([f"{bindir}/psql", self.url, "-Atc", q], capture_output=True, text=True)
        records, size = out.stdout.strip().split("|")
        return int(records), int(size)

    def cpu(self):
        return {name: cpu_seconds(p.pid) for name, p in self.measured.items()}

    def rss(self):
        return {name: rss_mib(p.pid) for name, p in self.measured.items()}

    def stop(self):
        stop_all(self.procs)
        if self.pg_dir is not None:
            here = os.path.dirname(os.path.abspath(__file__))
            subprocess.run([f"{here}/../../tests/postgres/ctl.sh", "stop", self.pg_dir],
                           stderr=subprocess.DEVNULL)


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


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
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite",
                    help="sqlite: one `rollgate up`; postgres: `controller` + `gateway` on PostgreSQL")
    args = ap.parse_args()
    rollgate = os.path.abspath(args.rollgate)
    procs, rg = [], None
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
            rg = Rollgate(rollgate, d, args.tick, args.store, "CADENCE_LOG")
            api = Api(rg.api_port)
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
            audit_before, log_before = rg.db_bytes(), rg.audit()
            e0, c0, t0 = evaluations(api), rg.cpu(), time.time()
            time.sleep(args.window)
            e1, c1, t1 = evaluations(api), rg.cpu(), time.time()
            rss = rg.rss()
            audit_after, log_after = rg.db_bytes(), rg.audit()
            window = t1 - t0
            looks = [e1[i] - e0[i] for i in e0 if i in e1]
            if len(looks) < args.models:
                print(f"only {len(looks)} of {args.models} rollouts still active", file=sys.stderr)
            intervals = [window / max(n, 1e-9) for n in looks]
            cpu = ", ".join(f"{n} {100 * (c1[n] - c0[n]) / window:.0f}" for n in c1)
            mem = ", ".join(f"{n} {v:.0f}" for n, v in rss.items())
            per_hour = 3600 / window
            print("| store | rollouts | window s | looks per rollout p50 | look interval p50 s | p99 s "
                  "| max s | CPU (% of a core) | RSS MiB | database growth KiB/h | audit records/h "
                  "| audit KiB/h | setup s |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            print(f"| {args.store} | {args.models} | {window:.0f} | {quantile(looks, 0.5)} | "
                  f"{quantile(intervals, 0.5):.2f} | {quantile(intervals, 0.99):.2f} | "
                  f"{max(intervals):.2f} | {cpu} | {mem} | "
                  f"{(audit_after - audit_before) / 1024 * per_hour:.0f} | "
                  f"{(log_after[0] - log_before[0]) * per_hour:.0f} | "
                  f"{(log_after[1] - log_before[1]) / 1024 * per_hour:.0f} | {setup:.0f} |")
        finally:
            if rg is not None:
                rg.stop()
            stop_all(procs)


if __name__ == "__main__":
    main()
