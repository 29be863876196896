#!/usr/bin/env python3
"""P/D between two GPUs of one host, end to end (issue 9), run on the lent
machine through scripts/gpu_run.sh:

    bash scripts/gpu_run.sh python3 scripts/pd_gpu_smoke.py --protocol nvlink_intra --protocol tcp

1. Correctness, per Mooncake transport: the embedded model on a `both`
   worker (cuda:0) and on a prefill (cuda:0) + decode (cuda:1) pair; greedy
   multi-turn sessions (token-id prompts) must give the same text on both,
   with the decode worker's paths remote_prefill -> bypass/direct_append, and a
   session moved to a fresh decode worker served by bypass.
2. With --tiered, per transport: P's snapshot store smaller than the
   sessions pushed to it demotes the oldest to its pinned host tier, and a
   moved session's turn is served by bypass from there.
3. With --big MODEL_DIR: the Qwen3-30B-A3B-shaped dummy model on P and D;
   load time, one long first turn and one append, paths, transferred bytes.

Prints one line per check; exits 1 when a check fails. Needs httpx (there).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time

import httpx

BIN = os.environ.get("KVC_BIN", "/tmp/kvc-gpu-bin")
TOKEN = "smoke"
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILED.append(what)


class Server:
    def __init__(self, name: str, port: int, args: list[str], log_dir: str):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = open(os.path.join(log_dir, f"{name}.log"), "w")
        cmd = [os.path.join(BIN, "kvc-server"), "--host", "127.0.0.1", "--port", str(port), *args]
        print(f"[{time.strftime('%X')}] start {name}: {' '.join(cmd[1:])}", flush=True)
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")})

    def wait_ready(self, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                print(f"{self.name} exited with {self.proc.returncode}", flush=True)
                return False
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    print(f"[{time.strftime('%X')}] {self.name} ready after {time.time() - self.t0:.1f} s", flush=True)
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        print(f"{self.name} not ready after {timeout} s", flush=True)
        return False

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def complete(s: Server, prompt, session=None, max_tokens=16):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if session:
        body["session_id"] = session
    t = time.time()
    r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=600)
    dt = time.time() - t
    if r.status_code != 200:
        return None, dt, r.text[:300]
    out = r.json()
    return out, dt, out.get("kvc", {})


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 150000) for _ in range(n)]


def sum_metric(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def pd_flags(role: str, protocol: str, extra: list[str]) -> list[str]:
    return ["--role", role, "--cluster-token", TOKEN, "--kv-transport-protocol", protocol, "--peer-poll-interval-s", "0.2", *extra]


TINY = ["--num-kv-blocks", "4096", "--max-num-batched-tokens", "2048"]


def tiny_server(name: str, port: int, log_dir: str, device: str, role: str | None = None, protocol: str = "", extra=()) -> Server:
    """A worker on a small pool: colocated (`role` None) or a P/D role."""
    flags = [*TINY, *extra]
    return Server(name, port, ["--device", device, *(pd_flags(role, protocol, flags) if role else flags)], log_dir)


def started(servers, what: str, timeout: float = 300) -> bool:
    """Every one of `servers` ready, then a second for the first peer poll;
    else the failed check `what`."""
    if not all(s.wait_ready(timeout) for s in servers):
        check(False, what)
        return False
    time.sleep(1.0)  # first peer poll
    return True


def same_text(both: Server, d: Server, prompt, session: str):
    """`prompt` on the both worker and on `d` in `session`: whether their
    greedy texts are equal (None where a request failed), `d`'s time and its
    kvc info (its error where it failed)."""
    ref, _, _ = complete(both, prompt)
    got, dt, info = complete(d, prompt, session=session)
    if ref is None or got is None:
        return None, dt, info
    return ref["choices"][0]["text"] == got["choices"][0]["text"], dt, info


def path_of(info) -> str:
    return info.get("path") if isinstance(info, dict) else info


def stop(*servers) -> None:
    for s in servers:
        if s:
            s.stop()


def correctness(protocol: str, log_dir: str, port: int) -> None:
    both = tiny_server(f"tiny-both-{protocol}", port, log_dir, "cuda:0")
    p = tiny_server(f"tiny-p-{protocol}", port + 1, log_dir, "cuda:0", "prefill", protocol)
    pd = [f"--prefill-peer", p.url, "--remote-prefill-policy", "threshold", "--remote-prefill-min-tokens", "64", "--snapshot-min-tokens", "64"]
    d1 = tiny_server(f"tiny-d1-{protocol}", port + 2, log_dir, "cuda:1", "decode", protocol, pd)
    d2 = None
    try:
        if not started((both, p, d1), f"{protocol}: servers start"):
            return
        rng = random.Random(7)
        same, paths = True, []
        sessions = []
        for i in range(4):
            prompt = ids(rng, rng.randrange(300, 1500))
            sid = f"{protocol}-s{i}"
            for turn in range(3):
                equal, dt, info = same_text(both, d1, prompt, sid)
                if equal is None:
                    check(False, f"{protocol}: request failed: {info}")
                    return
                paths.append(info.get("path"))
                same &= equal
                prompt = prompt + ids(rng, 16) + ids(rng, rng.randrange(80, 400))
            sessions.append((sid, prompt))
        check(same, f"{protocol}: 4 sessions x 3 turns through P/D equal the both worker's greedy text")
        print(f"{protocol}: paths {paths}", flush=True)
        # Threshold policy: every suffix of >= 64 tokens goes to P. A later
        # turn is bypass when D's snapshot push has reached P by then (it is
        # asynchronous), else a plain remote prefill; either way the text
        # above must match.
        firsts, laters = paths[0::3], [x for i, x in enumerate(paths) if i % 3]
        check(all(x == "remote_prefill" for x in firsts) and "bypass" in laters
              and all(x in ("bypass", "direct_append", "remote_prefill") for x in laters),
              f"{protocol}: turn 1 remote_prefill, later turns served from P's snapshot (bypass) at least once")
        m = d1.metrics()
        print(f"{protocol}: D1 kv bytes {sum_metric(m, 'kvc_kv_transfer_bytes_total'):.0f}, snapshot pushes sent {sum_metric(m, 'kvc_snapshot_push_sent_total'):.0f}", flush=True)
        # Session move: a fresh D2 serves the next turn from P's snapshot.
        deadline = time.time() + 30
        while time.time() < deadline and sum_metric(d1.metrics(), "kvc_snapshot_push_sent_total") < 4:
            time.sleep(0.5)
        d2 = tiny_server(f"tiny-d2-{protocol}", port + 3, log_dir, "cuda:1", "decode", protocol, pd)
        if not started((d2,), f"{protocol}: D2 starts"):
            return
        sid, prompt = sessions[0]
        equal, dt, info = same_text(both, d2, prompt, sid)
        check(bool(equal) and info.get("path") == "bypass", f"{protocol}: moved session served by {path_of(info)} with equal text")
    finally:
        stop(d2, d1, p, both)


def tiered(protocol: str, log_dir: str, port: int) -> None:
    """Issue 20 item 3 on the GPU: P's snapshot store holds 64 pool blocks;
    D1 computes four sessions of 32 blocks itself and pushes them, so P
    demotes the two oldest to its pinned host tier. A fresh D2 gets the
    oldest session's next turn: P copies its blocks back (PinnedArena) and
    serves it by bypass, with the both worker's greedy text."""
    both = tiny_server(f"tier-both-{protocol}", port, log_dir, "cuda:0")
    p = tiny_server(f"tier-p-{protocol}", port + 1, log_dir, "cuda:0", "prefill", protocol, ["--snapshot-store-blocks", "64"])
    pd = ["--prefill-peer", p.url, "--remote-prefill-policy", "threshold", "--snapshot-min-tokens", "64"]
    d1 = tiny_server(f"tier-d1-{protocol}", port + 2, log_dir, "cuda:1", "decode", protocol, [*pd, "--remote-prefill-min-tokens", "100000"])
    d2 = None
    try:
        if not started((both, p, d1), f"{protocol} tiered: servers start"):
            return
        rng = random.Random(13)
        sessions = [(f"{protocol}-tier{i}", ids(rng, 512)) for i in range(4)]
        for sid, prompt in sessions:
            equal, _, info = same_text(both, d1, prompt, sid)
            if equal is None:
                check(False, f"{protocol} tiered: request failed: {info}")
                return
            deadline = time.time() + 30
            while time.time() < deadline and httpx.get(f"{p.url}/v1/sessions/{sid}/snapshot", timeout=5).json().get("tokens") != 512:
                time.sleep(0.2)
        tiers = [httpx.get(f"{p.url}/v1/sessions/{sid}/snapshot", timeout=5).json().get("tier") for sid, _ in sessions]
        check(tiers == ["host", "host", "device", "device"], f"{protocol} tiered: P keeps 4 x 32 blocks in 64 by demoting the oldest two ({tiers})")
        d2 = tiny_server(f"tier-d2-{protocol}", port + 3, log_dir, "cuda:1", "decode", protocol, [*pd, "--remote-prefill-min-tokens", "64"])
        if not started((d2,), f"{protocol} tiered: D2 starts"):
            return
        sid, prompt = sessions[0]
        prompt = prompt + ids(rng, 200)
        equal, dt, info = same_text(both, d2, prompt, sid)
        m = p.metrics()
        host_hits = m.get('kvc_snapshot_bypass_hits_total{tier="host"}', 0)
        restored = m.get("kvc_snapshot_restored_blocks_total", 0)
        check(bool(equal) and info.get("path") == "bypass" and info.get("computed_tokens") == 200 and host_hits == 1 and restored == 32,
              f"{protocol} tiered: the demoted session served by {path_of(info)} from P's host tier "
              f"in {dt * 1e3:.0f} ms, equal text (host hits {host_hits:.0f}, restored blocks {restored:.0f})")
        for k, v in sorted(m.items()):
            if k.startswith(("kvc_snapshot_", "kvc_host_tier_bytes_total")):
                print(f"  P {k} {v}", flush=True)
    finally:
        stop(d2, d1, p, both)


def big(model_dir: str, protocol: str, log_dir: str, port: int, prompt_tokens: int) -> None:
    flags = ["--model", model_dir, "--load-format", "dummy", "--max-num-batched-tokens", "8192"]
    p = Server("big-p", port, ["--device", "cuda:0", *pd_flags("prefill", protocol, flags)], log_dir)
    d = Server("big-d", port + 1, ["--device", "cuda:1", *pd_flags("decode", protocol, [*flags, "--prefill-peer", p.url])], log_dir)
    try:
        if not started((p, d), "30B shape: servers start", timeout=600):
            return
        rng = random.Random(11)
        prompt = ids(rng, prompt_tokens)
        for turn in range(3):
            out, dt, info = complete(d, prompt, session="big", max_tokens=64)
            if out is None:
                check(False, f"30B shape turn {turn}: {info}")
                return
            print(f"30B shape turn {turn}: {len(prompt)} prompt tokens, {dt:.2f} s for 64 tokens, kvc {info}", flush=True)
            prompt = prompt + ids(rng, 64) + ids(rng, 500)
        m = d.metrics()
        check(True, f"30B shape: 3 turns served; D kv bytes {sum_metric(m, 'kvc_kv_transfer_bytes_total'):.0f}")
        for k, v in sorted(m.items()):
            if any(x in k for x in ("transfer", "snapshot", "remote_prefill", "bandwidth", "prefill_path")):
                print(f"  D {k} {v}")
    finally:
        stop(d, p)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--protocol", action="append", default=[])
    ap.add_argument("--tiered", action="store_true", help="also the tiered snapshot store check (issue 20 item 3)")
    ap.add_argument("--big", help="model dir of the 30B-shaped dummy model")
    ap.add_argument("--big-protocol", default=None)
    ap.add_argument("--big-prompt-tokens", type=int, default=8192)
    ap.add_argument("--logs", default=os.environ.get("OUT", "/tmp") + "/smoke-logs")
    a = ap.parse_args()
    os.makedirs(a.logs, exist_ok=True)
    port = 18700
    for proto in a.protocol or ["tcp"]:
        correctness(proto, a.logs, port)
        port += 10
        if a.tiered:
            tiered(proto, a.logs, port)
            port += 10
    if a.big:
        big(a.big, a.big_protocol or (a.protocol or ["tcp"])[0], a.logs, port, a.big_prompt_tokens)
    print("FAILED: " + "; ".join(FAILED) if FAILED else "all checks passed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
