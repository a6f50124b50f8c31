"""Valid requests after the gateway's own refusals on one keep-alive
connection, as a pooling client sends them (Python's http.client, which
reuses its connection until told to close it). Each round sends a refused
request (an unknown model, the wrong protocol, a path with no route; its
body sent with the headers, or 200 ms late) and then a valid prediction on
the same connection. A valid request that fails (a broken pipe, a reset, a
non-200) is counted; nothing is retried. Prints one JSON line.

Usage: python3 refusals.py HOST:PORT [--valid N]
"""
import argparse
import http.client
import json
import socket
import time

BODY = b'{"instances":[[1.0,2.0,3.0]]}'
REFUSALS = [("/v1/models/nope:predict", 404), ("/v2/models/m/infer", 400), ("/no/route", 404)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("--valid", type=int, default=10_000)
    a = p.parse_args()
    host, port = a.addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    failures, refusals_seen, reconnects = 0, 0, 0
    started = time.monotonic()
    headers = {"content-type": "application/json"}
    for n in range(a.valid):
        path, status = REFUSALS[n % len(REFUSALS)]
        late = n % 50 == 0  # every 50th refused body arrives 200 ms late
        try:
            if late:
                conn.putrequest("POST", path)
                conn.putheader("content-type", "application/json")
                conn.putheader("content-length", str(len(BODY)))
                conn.endheaders()
                time.sleep(0.2)
                conn.send(BODY)
            else:
                conn.request("POST", path, BODY, headers)
            r = conn.getresponse()
            r.read()
            refusals_seen += r.status == status
            if r.getheader("connection", "").lower() == "close":
                conn.close()
                reconnects += 1
        except (OSError, http.client.HTTPException):
            conn.close()
            reconnects += 1
        try:
            conn.request("POST", "/v1/models/m:predict", BODY, {**headers, "x-rollgate-key": f"user-{n}"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                failures += 1
        except (OSError, http.client.HTTPException, socket.timeout):
            failures += 1
            conn.close()
    print(json.dumps({
        "valid_requests": a.valid,
        "valid_failed": failures,
        "refusals_answered_as_expected": refusals_seen,
        "connections_reopened": reconnects,
        "seconds": round(time.monotonic() - started, 1),
    }))


if __name__ == "__main__":
    main()
