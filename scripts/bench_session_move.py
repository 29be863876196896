#!/usr/bin/env python3
"""Session-move latency: bypass vs recomputation (docs/benchmarks.md).

Starts separate kvc-server processes on 127.0.0.1 (one prefill worker P,
decode workers D1 and D2, a colocated `both` worker), KV over Mooncake TCP,
and for each session size:

1. builds an N-token session on D1 (remote prefill on P; D1 then pushes its
   snapshot to P) and waits until P's snapshot covers it;
2. moves it: the next turn (N + 64 tokens, max_tokens 1) goes to D2, which
   never saw it -> P bypasses the snapshot and transfers the KV (`bypass`);
3. the same next turn after P lost the snapshot and its prefix cache ->
   P recomputes everything and transfers it (`remote recompute`);
4. the same next turn on a cold colocated worker (`local recompute`).

Latency is the time to the complete 1-token answer (= time to first token).
It also measures the fixed overhead of a remote prefill (a short prompt,
remote vs local) and derives the suffix length below which a remote prefill
cannot pay off (overhead x local prefill rate): the measured basis of
`--remote-prefill-min-tokens`.

    python3 scripts/bench_session_move.py --bin target/release/kvc-server --sizes 1024,8192,32000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

TOKEN = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, binary: str, logdir: str, name: str, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(logdir, f"{name}.log")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(self.port), *flags],
                                         stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"{name} exited:\n{open(self.log).read()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"{name} did not start")
            time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 150000) for _ in range(n)]


def complete(url: str, prompt: list[int], session: str | None = None) -> tuple[float, dict]:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    if session:
        body["session_id"] = session
    t = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    took = time.perf_counter() - t
    r.raise_for_status()
    return took, r.json()


def wait(pred, what: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.05)


def snapshot_tokens(p: Proc, session: str) -> int:
    r = httpx.get(f"{p.url}/v1/sessions/{session}/snapshot", timeout=10).json()
    return r["tokens"] if r["exists"] else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/kvc-server")
    ap.add_argument("--sizes", default="1024,8192,32000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    logdir = tempfile.mkdtemp(prefix="kvc-bench-move-")
    blocks = str(max(sizes) // 16 * 3 + 512)
    common = ["--num-kv-blocks", blocks, "--max-num-batched-tokens", "2048"]
    p = Proc(a.bin, logdir, "P", "--role", "prefill", "--cluster-token", TOKEN, *common)
    dflags = ["--role", "decode", "--cluster-token", TOKEN, "--prefill-peer", p.url, "--remote-prefill-policy", "threshold",
              "--remote-prefill-min-tokens", "64", "--snapshot-min-tokens", "64", "--peer-poll-interval-s", "0.1", *common]
    d1 = Proc(a.bin, logdir, "D1", *dflags)
    d2 = Proc(a.bin, logdir, "D2", *dflags)
    both = Proc(a.bin, logdir, "both", *common)
    procs = [p, d1, d2, both]
    try:
        for d in (d1, d2):
            wait(lambda: f'kvc_prefill_peer_healthy{{peer="{p.url}"}} 1' in httpx.get(f"{d.url}/metrics").text, "peer health")
        results = {"sizes": {}, "overhead": {}}
        # Warm-up (first transfers open segments and touch pages).
        complete(d2.url, ids(1, 256))
        complete(both.url, ids(1, 256))

        # Fixed overhead of a remote prefill: a 64-token prompt, remote vs local.
        rem, loc = [], []
        for r in range(10):
            rem.append(complete(d1.url, ids(100 + r, 64))[0])
            loc.append(complete(both.url, ids(200 + r, 64))[0])
        overhead = statistics.median(rem) - statistics.median(loc)
        results["overhead"] = {"remote_64_ms": statistics.median(rem) * 1e3, "local_64_ms": statistics.median(loc) * 1e3,
                               "overhead_ms": overhead * 1e3}

        for n in sizes:
            rows = {"bypass": [], "remote_recompute": [], "local_recompute": [], "p_computed_bypass": None}
            for run in range(a.runs):
                sid = f"move-{n}-{run}"
                t1 = ids(n * 10 + run, n)
                complete(d1.url, t1, sid)
                wait(lambda: snapshot_tokens(p, sid) >= (n // 16) * 16, "the snapshot")
                t2 = t1 + ids(n * 10 + run + 5, 64)
                took, out = complete(d2.url, t2, sid)
                assert out["kvc"]["path"] == "bypass", out["kvc"]
                rows["bypass"].append(took)
                rows["p_computed_bypass"] = out["kvc"]["computed_tokens"]
                # P forgets the session and its prefix cache; D2 forgets it too.
                for w in (p, d2):
                    httpx.delete(f"{w.url}/v1/sessions/{sid}")
                    httpx.post(f"{w.url}/reset_prefix_cache")
                took, out = complete(d2.url, t2, sid + "-again")
                assert out["kvc"]["path"] == "remote_prefill", out["kvc"]
                rows["remote_recompute"].append(took)
                httpx.post(f"{both.url}/reset_prefix_cache")
                took, out = complete(both.url, t2)
                assert out["kvc"]["computed_tokens"] == len(t2), out["kvc"]
                rows["local_recompute"].append(took)
                for w in procs:
                    httpx.delete(f"{w.url}/v1/sessions/{sid}")
                    httpx.delete(f"{w.url}/v1/sessions/{sid}-again")
                    httpx.post(f"{w.url}/reset_prefix_cache")
            results["sizes"][n] = rows
        # The local prefill rate at the largest size (long prompts amortise
        # the request's fixed costs).
        n, rows = max(results["sizes"].items())
        local_rate = (n + 64) / statistics.median(rows["local_recompute"])
        threshold = max(overhead, 0.0) * local_rate
        results["overhead"]["local_tokens_per_s"] = local_rate
        results["overhead"]["break_even_tokens"] = threshold

        print(f"\nremote-prefill fixed overhead: {overhead*1e3:.1f} ms (64-token prompt: remote "
              f"{results['overhead']['remote_64_ms']:.1f} ms, local {results['overhead']['local_64_ms']:.1f} ms); "
              f"local prefill ~{local_rate:.0f} tok/s -> break-even suffix ~{threshold:.0f} tokens\n")
        print("| session tokens | bypass (ms) | remote recompute (ms) | local recompute (ms) | bypass speed-up vs remote / local | tokens P computed with bypass |")
        print("|---|---|---|---|---|---|")
        for n, rows in results["sizes"].items():
            med = {k: statistics.median(v) * 1e3 for k, v in rows.items() if isinstance(v, list)}
            rng = {k: (min(v) * 1e3, max(v) * 1e3) for k, v in rows.items() if isinstance(v, list)}
            print(f"| {n} | {med['bypass']:.1f} ({rng['bypass'][0]:.0f}–{rng['bypass'][1]:.0f}) "
                  f"| {med['remote_recompute']:.1f} ({rng['remote_recompute'][0]:.0f}–{rng['remote_recompute'][1]:.0f}) "
                  f"| {med['local_recompute']:.1f} ({rng['local_recompute'][0]:.0f}–{rng['local_recompute'][1]:.0f}) "
                  f"| {med['remote_recompute']/med['bypass']:.1f}x / {med['local_recompute']/med['bypass']:.1f}x | {rows['p_computed_bypass']} |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        for w in procs:
            w.stop()


if __name__ == "__main__":
    main()
