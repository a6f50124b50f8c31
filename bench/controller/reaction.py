#!/usr/bin/env python3
"""How long a real `rollgate up` takes to roll back a candidate that starts
failing, alone and among N idle live rollouts.

Starts `rollgate up` (SQLite, `tick = "1s"`) on 127.0.0.1 — or with
`--store postgres` `rollgate controller` + `rollgate gateway` on a
throwaway PostgreSQL — and, as in cadence.py, N idle models each with an active rollout on two shared
`rollgate serve` servers (no traffic). Beside them, `--samples` sample
models, each with its own candidate server, in a 50% canary with traffic
through rollgate's gateway (`--rps` per sample, random keys). After
`--settle` seconds, one sample at a time, its candidate server is replaced
by one that answers every prediction 503 (`rollgate serve --ready-then-503`
on the same port): the reaction time is from that moment to the rollout
reading `rolled_back` in the API (polled every 50 ms). Run it with
`--models 0` and with `--models 1000` side by side: the issue's target is
the same reaction time (± 1 tick) either way.

    python3 bench/controller/reaction.py --rollgate target/debug/rollgate --models 1000

Prints one Markdown row. Every process it starts is stopped by its PID.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import http.client

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cadence import Api, Rollgate, free_port, quantile, stop_all, wait_port  # noqa: E402


def serve(rollgate, model, port, *extra):
    p = subprocess.Popen([rollgate, "serve", "--model", model, "--listen", f"127.0.0.1:{port}", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return p


def load(gw_port, names, rps, stop):
    """Requests to each of `names` at about `rps` each, random keys, until `stop`."""
    conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=10)
    body = b'{"instances": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]]}'  # the zoo's 12 features
    period = 1.0 / (rps * max(len(names), 1))
    end = time.time() + 3600
    i = 0
    while not stop.is_set() and time.time() < end:
        name = names[i % len(names)]
        i += 1
        try:
            conn.request("POST", f"/v1/models/{name}:predict", body,
                         {"content-type": "application/json",
                          "x-rollgate-key": f"user-{random.randrange(10_000)}"})
            conn.getresponse().read()
        except (http.client.HTTPException, OSError):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=10)
        time.sleep(period)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollgate", default="target/release/rollgate")
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--rps", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--tick", default="1s")
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    args = ap.parse_args()
    rollgate = os.path.abspath(args.rollgate)
    procs, rg = [], None
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as d:
        try:
            subprocess.run([rollgate, "train", "--out", f"{d}/zoo"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            model = f"{d}/zoo/{sorted(os.listdir(f'{d}/zoo'))[0]}"
            shared = [free_port() for _ in range(2)]
            procs += [serve(rollgate, model, p) for p in shared]
            candidates = [free_port() for _ in range(args.samples)]
            sample_servers = {p: serve(rollgate, model, p) for p in candidates}
            procs += list(sample_servers.values())
            rg = Rollgate(rollgate, d, args.tick, args.store, "REACTION_LOG")
            gw_port = rg.gw_port
            api = Api(rg.api_port)

            def rollout(name, champion_url, candidate_url, plan):
                api.call("POST", "/api/v1/models", {"name": name, "spec": {"protocol": "kserve_v1"}})
                revs = [api.call("POST", f"/api/v1/models/{name}/revisions",
                                 {"upstream": u, "served_name": "fraud"})["id"]
                        for u in (champion_url, candidate_url)]
                api.call("PUT", f"/api/v1/models/{name}/champion", {"revision": revs[0], "reason": "bench"})
                return api.call("POST", "/api/v1/rollouts",
                                {"model": name, "revision": revs[1], "plan": plan})["id"]

            idle = {"steps": [50], "min_stage_duration": "1h", "evidence_timeout": "2h",
                    "readiness_timeout": "2h"}
            urls = [f"http://127.0.0.1:{p}" for p in shared]
            for i in range(args.models):
                rollout(f"m{i}", urls[0], urls[1], idle)
            # The samples judge live traffic: no SHADOW, straight to 50%.
            live = {"steps": [50], "min_stage_duration": "1h", "evidence_timeout": "2h",
                    "readiness_timeout": "2m", "shadow": {"enabled": False}}
            samples = {}
            for j, port in enumerate(candidates):
                samples[f"s{j}"] = (port, rollout(f"s{j}", urls[0], f"http://127.0.0.1:{port}", live))
            threads = [threading.Thread(target=load, args=(gw_port, [name], args.rps, stop), daemon=True)
                       for name in samples]
            for t in threads:
                t.start()
            time.sleep(args.settle)
            reactions, c0, t0 = [], rg.cpu(), time.time()
            for name, (port, rid) in samples.items():
                r = api.call("GET", f"/api/v1/rollouts/{rid}")
                if r["state"]["phase"]["phase"] != "canary":
                    sys.exit(f"{name}: {r['state']['phase']} before it failed")
                old = sample_servers.pop(port)
                old.send_signal(signal.SIGTERM)
                old.wait(timeout=15)
                failing = serve(rollgate, model, port, "--ready-then-503")
                procs.append(failing)
                started = time.time()
                while time.time() - started < 120:
                    phase = api.call("GET", f"/api/v1/rollouts/{rid}")["state"]["phase"]
                    if phase["phase"] != "canary":
                        break
                    time.sleep(0.05)
                took = time.time() - started
                if phase["phase"] != "rolled_back":
                    r = api.call("GET", f"/api/v1/rollouts/{rid}")
                    sys.exit(f"{name}: {phase} after {took:.1f} s: {str(r)[:3000]}")
                reactions.append(took)
            c1, window = rg.cpu(), time.time() - t0
            cpu = ", ".join(f"{n} {100 * (c1[n] - c0[n]) / window:.0f}" for n in c1)
            print("| store | idle rollouts | samples | rps each | reaction p50 s | max s | CPU (% of a core) |")
            print("|---|---|---|---|---|---|---|")
            print(f"| {args.store} | {args.models} | {len(reactions)} | {args.rps:.0f} | "
                  f"{quantile(reactions, 0.5):.2f} | {max(reactions):.2f} | {cpu} |")
            print("reactions s: " + ", ".join(f"{x:.2f}" for x in reactions), file=sys.stderr)
        finally:
            stop.set()
            if rg is not None:
                rg.stop()
            stop_all(procs)


if __name__ == "__main__":
    main()
