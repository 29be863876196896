#!/usr/bin/env python3
"""/health latency while N requests of 200K tool definitions each arrive at
once (issue 31: each is refused with a 400 after its body is parsed off the
async runtime). Standard library only, so it runs on the lent GPU machine
(no PyPI there) as well as here:

    python3 scripts/health_under_tools.py --url http://127.0.0.1:8000 [--requests 8]

Prints the /health latencies (p50, p99, max) measured meanwhile and the
requests' statuses; exits 1 if any request is not a 400 or /health fails.
tests/openai/test_limits.py asserts the same with a loose bound for a
2-core CI machine.
"""
import argparse
import concurrent.futures
import json
import time
import urllib.error
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tools", type=int, default=200_000)
    ap.add_argument("--model", help="default: the first of /v1/models")
    a = ap.parse_args()
    if not a.model:
        with urllib.request.urlopen(f"{a.url}/v1/models", timeout=30) as r:
            a.model = json.loads(r.read())["data"][0]["id"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = json.dumps({"model": a.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       "tools": [tool] * a.tools}).encode()
    lat = []
    with concurrent.futures.ThreadPoolExecutor(a.requests) as pool:
        futs = [pool.submit(post, f"{a.url}/v1/chat/completions", body) for _ in range(a.requests)]
        while not all(f.done() for f in futs):
            t = time.monotonic()
            with urllib.request.urlopen(f"{a.url}/health", timeout=30) as r:
                assert r.status == 200
            lat.append(time.monotonic() - t)
            time.sleep(0.02)
    statuses = [f.result() for f in futs]
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * (len(lat) - 1)))] * 1e3
    print(f"{a.requests} requests of {a.tools} tools ({len(body) / 2**20:.1f} MiB each): statuses {statuses}")
    print(f"/health during them: {len(lat)} probes, p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {lat[-1] * 1e3:.1f} ms")
    return 0 if all(s == 400 for s in statuses) else 1


if __name__ == "__main__":
    raise SystemExit(main())
