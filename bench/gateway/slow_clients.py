#!/usr/bin/env python3
"""Hostile clients beside real users, side by side in one run.

Attack (while `--seconds` pass): `--loris` slowloris connections that send a
request's headers one byte every 2 s (and reconnect when closed), plus
`--slow-bodies` clients that send headers and a 100-byte body's first byte,
then one more byte every 5 s (more of them than the gateway's
`max_concurrent`). Real users: wrk, 4 connections, for `--seconds`.

Prints one JSON object per cell: unloaded and attacked, alternated twice,
with wrk's p50/p99 latency and the gateway's slow-client counter.
Usage: slow_clients.py GATEWAY_ADDR [--loris 200] [--slow-bodies 60] [--seconds 10]
"""
import argparse
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request

BODY = b'{"instances":[[1.0,2.0,3.0]]}'


def loris(addr, stop, counters):
    host, port = addr.split(":")
    head = b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    while not stop.is_set():
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            counters["connections"] += 1
            for b in head:
                if stop.is_set():
                    break
                s.sendall(bytes([b]))
                stop.wait(2.0)
            s.close()
        except OSError:
            counters["closed_by_gateway"] += 1
            stop.wait(0.2)


def slow_body(addr, stop, counters):
    host, port = addr.split(":")
    head = (
        b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n"
    )
    while not stop.is_set():
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(head)
            for _ in range(100):
                if stop.is_set():
                    break
                s.sendall(b" ")
                stop.wait(5.0)
            s.close()
        except OSError:
            counters["body_cut"] += 1
            stop.wait(0.2)


def wrk(addr, seconds):
    script = "/tmp/rollgate-slow-clients.lua"
    with open(script, "w") as f:
        f.write(
            'wrk.method = "POST"\nwrk.body = \'%s\'\n'
            'wrk.headers["content-type"] = "application/json"\n' % BODY.decode()
        )
    out = subprocess.run(
        ["wrk", "-t1", "-c4", f"-d{seconds}s", "--latency", "-s", script,
         f"http://{addr}/v1/models/m:predict"],
        capture_output=True, text=True, check=True,
    ).stdout

    def ms(label):
        m = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v

    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "requests": reqs,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(1) if errors else "",
        "p50_ms": ms("50"),
        "p99_ms": ms("99"),
    }


def slow_clients_metric(addr):
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    m = re.search(r"^rollgate_slow_clients_total(?:\{\})? (\d+)", text, re.M)
    return int(m.group(1)) if m else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("--loris", type=int, default=200)
    p.add_argument("--slow-bodies", type=int, default=60)
    p.add_argument("--seconds", type=int, default=10)
    a = p.parse_args()
    for round_ in range(2):
        for attacked in (False, True):
            stop = threading.Event()
            counters = {"connections": 0, "closed_by_gateway": 0, "body_cut": 0}
            threads = []
            if attacked:
                threads = [threading.Thread(target=loris, args=(a.addr, stop, counters), daemon=True)
                           for _ in range(a.loris)]
                threads += [threading.Thread(target=slow_body, args=(a.addr, stop, counters), daemon=True)
                            for _ in range(a.slow_bodies)]
                for t in threads:
                    t.start()
                time.sleep(3)  # let every hostile connection open first
            cell = wrk(a.addr, a.seconds)
            stop.set()
            for t in threads:
                t.join(timeout=10)
            cell.update(round=round_, attacked=attacked, loris=a.loris if attacked else 0,
                        slow_bodies=a.slow_bodies if attacked else 0,
                        slow_clients_total=slow_clients_metric(a.addr), **counters)
            print(json.dumps(cell), flush=True)


if __name__ == "__main__":
    main()
