#!/usr/bin/env python3
"""Session KV under memory pressure (issue 20, item 4): does the host tier
bring evicted sessions back, exactly?

Runs the same multi-turn workload twice against a kvc-server started here:
1. constrained: a KV pool of --pool-tokens tokens (--num-kv-blocks) with a
   host tier (--swap-space GiB), far smaller than the sessions' KV;
2. reference: the same server without those limits.

Workload: --sessions sessions x --turns turns; turn 1 is a random prompt
of 8K-12K tokens (--first-min/--first-max), every later turn appends
--append random tokens; greedy, --max-tokens tokens, ignore_eos. Turns go
round-robin over the sessions (all sessions' turn 1, then all turn 2 ...),
--concurrency at a time, with a --think-s gap after each turn of a
session. With --concurrency 1 the batches of both runs are identical, so
the answers should be equal token for token. They are not quite: the
random-weight model has near-ties (top two logprobs one or two bf16 steps
apart), and these flip between the two servers even on a session's first
turn, which the host tier never touches (other physical blocks, other
rounding). So a differing answer fails the check only where the
reference's top two logprobs were more than --tie-ulps bf16 steps apart.
With more concurrency, batch composition differs too: mismatches are only
reported.

Checks (exit 1 on failure): no request fails; answers equal (concurrency
1); the constrained run restored blocks from host (kvc_host_restores_total
> 0); after every session is deleted, free device blocks + prefix-cached
blocks = total and free host slots = total.

    scripts/gpu_run.sh python3 scripts/host_tier_pressure.py --bin /tmp/kvc-gpu-bin/kvc-server --model .gpu/qwen3-30b-a3b -- --load-format dummy --device cuda
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvc_local  # noqa: E402  (needs httpx: the device has it)


def http(method: str, url: str, body=None, timeout: float = 600.0) -> tuple[int, str]:
    """(status, text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


LOG_DIR: str | None = None


def start(binary: str, *flags: str) -> tuple[subprocess.Popen, str]:
    """kvc-server on a free local port, once /health answers (up to 10 min:
    pinning tens of GiB of host memory takes a while); its log in --log-dir
    when given."""
    log = tempfile.NamedTemporaryFile("w", prefix="kvc-pressure-", suffix=".log", delete=False, dir=LOG_DIR)
    return kvc_local.start(binary, *flags, wait_s=600, log=log)


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([-0-9.e+]+)$", line)
        if m:
            total += float(m.group(2))
    return total


def workload(args) -> list[list[list[int]]]:
    """prompts[session][turn] as token ids (fixed by --seed)."""
    rng = random.Random(args.seed)
    vocab = (1000, 150000)
    out = []
    for _ in range(args.sessions):
        p = [rng.randrange(*vocab) for _ in range(rng.randint(args.first_min, args.first_max))]
        turns = [p]
        for _ in range(args.turns - 1):
            p = p + [rng.randrange(*vocab) for _ in range(args.append)]
            turns.append(p)
        out.append(turns)
    return out


def run(url: str, model: str, prompts, args, tag: str) -> tuple[dict, list[str], float]:
    answers: dict = {}
    failures: list[str] = []

    def turn(s: int, t: int):
        body = {"model": model, "prompt": prompts[s][t], "max_tokens": args.max_tokens, "temperature": 0,
                "ignore_eos": True, "session_id": f"{tag}-{args.seed}-{s}", "logprobs": 2}
        started = time.monotonic()
        status, text = http("POST", url + "/v1/completions", body, timeout=args.timeout_s)
        took = time.monotonic() - started
        if status != 200:
            return s, t, None, f"session {s} turn {t}: HTTP {status} {text[:200]}", took
        time.sleep(args.think_s)
        c = json.loads(text)["choices"][0]
        return s, t, (c["logprobs"]["tokens"], c["logprobs"]["top_logprobs"]), None, took

    started = time.monotonic()
    ttft = []
    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        for t in range(args.turns):
            for s, tt, text, err, took in pool.map(lambda s: turn(s, t), range(args.sessions)):
                if err:
                    failures.append(err)
                else:
                    answers[(s, tt)] = text
                    ttft.append(took)
    wall = time.monotonic() - started
    print(f"{tag}: {len(answers)} answers, {len(failures)} failures in {wall:.1f} s; "
          f"turn latency p50 {sorted(ttft)[len(ttft) // 2] if ttft else 0:.2f} s")
    return answers, failures, wall


def stream_token_times(url: str, body: dict, out: list, ready) -> None:
    """Streams one completion, appending each token event's arrival time to
    `out`; sets `ready` after the first."""
    data = json.dumps({**body, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=data, method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: {"):
                out.append(time.monotonic())
                ready.set()


def demoted_turn_ttft(args, base: list[str]) -> None:
    """TTFT of a turn whose --probe-tokens session was pushed out of the pool
    by another session of the same size: restored from the host tier, vs
    recomputed (no host tier). Pool: 1.25x the session plus room for
    --probe-decodes short streams that decode all through the restore: the
    largest gap between their tokens while it runs is the restore's (and
    the other session's demotion's) cost to running requests."""
    import threading

    rng = random.Random(args.seed + 1)
    n = args.probe_tokens
    a = [rng.randrange(1000, 150000) for _ in range(n)]
    b = [rng.randrange(1000, 150000) for _ in range(n)]
    nxt = a + [rng.randrange(1000, 150000) for _ in range(64)]
    k, gen = args.probe_decodes, 400
    blocks = (n * 5 // 4 + k * (64 + gen + args.block_size)) // args.block_size
    runs = [("host tier", blocks, [f"--swap-space={args.swap_space}"]), ("recompute", blocks, ["--swap-space=0"])]
    if args.probe_write_back:
        runs.insert(1, ("host tier, write-back from 90 % use", blocks, [f"--swap-space={args.swap_space}", "--host-write-back-watermark=0.9"]))
        # The same turns where nothing is demoted: what the decodes' gaps
        # are without any copy.
        runs.append(("resident, no pressure", 2 * blocks, ["--swap-space=0"]))
    for tag, pool, flags in runs:
        proc, url = start(args.bin, *base, f"--num-kv-blocks={pool}", *flags, f"--max-model-len={n + 256}")
        try:
            model = json.loads(http("GET", url + "/v1/models")[1])["data"][0]["id"]
            def turn(prompt, sid):
                body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "session_id": sid}
                t0 = time.monotonic()
                status, text = http("POST", url + "/v1/completions", body)
                assert status == 200, text[:300]
                return time.monotonic() - t0, time.monotonic()
            cold, _ = turn(a, "probe-a")
            turn(b, "probe-b")  # pushes probe-a out of the pool
            times: list[list[float]] = [[] for _ in range(k)]
            events = [threading.Event() for _ in range(k)]
            threads = []
            for i in range(k):
                body = {"model": model, "prompt": [rng.randrange(1000, 150000) for _ in range(64)], "max_tokens": gen,
                        "temperature": 0, "ignore_eos": True}
                th = threading.Thread(target=stream_token_times, args=(url, body, times[i], events[i]), daemon=True)
                th.start()
                threads.append(th)
            for e in events:
                e.wait(120)
            time.sleep(0.3)  # a few steps of decodes alone, for their usual gap
            sent = time.monotonic()
            again, done = turn(nxt, "probe-a")
            for th in threads:
                th.join(600)
            gaps_all = [t2 - t1 for ts in times for t1, t2 in zip(ts, ts[1:])]
            during = [t2 - t1 for ts in times for t1, t2 in zip(ts, ts[1:]) if t2 > sent and t1 < done]
            p50 = sorted(gaps_all)[len(gaps_all) // 2] if gaps_all else 0.0
            m = http("GET", url + "/metrics")[1]
            print(f"{n}-token session, next turn after demotion ({tag}): {again * 1e3:.0f} ms "
                  f"(its first turn, cold: {cold * 1e3:.0f} ms); host restores {metric(m, 'kvc_host_restores_total'):.0f} blocks, "
                  f"written back {metric_label(m, 'kvc_host_tier_write_back_blocks_total', 'outcome', 'copied'):.0f} "
                  f"(used {metric_label(m, 'kvc_host_tier_write_back_blocks_total', 'outcome', 'used'):.0f}); "
                  f"{k} decodes beside it: token gap p50 {p50 * 1e3:.1f} ms, largest while it ran "
                  f"{max(during, default=0.0) * 1e3:.1f} ms")
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def metric_label(text: str, name: str, label: str, value: str) -> float:
    """Sum of `name`'s samples whose `label` is `value`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'{label}="{value}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--log-dir", default=None, help="keep the servers' logs here")
    ap.add_argument("flags", nargs="*", help="more kvc-server flags (after --)")
    work = ap.add_argument_group("workload")
    work.add_argument("--sessions", type=int, default=40)
    work.add_argument("--turns", type=int, default=6)
    work.add_argument("--first-min", type=int, default=8000)
    work.add_argument("--first-max", type=int, default=12000)
    work.add_argument("--append", type=int, default=400)
    work.add_argument("--max-tokens", type=int, default=16)
    work.add_argument("--think-s", type=float, default=0.5)
    work.add_argument("--concurrency", type=int, default=1)
    work.add_argument("--seed", type=int, default=0)
    work.add_argument("--timeout-s", type=float, default=600.0)
    pressure = ap.add_argument_group("the constrained server")
    pressure.add_argument("--pool-tokens", type=int, default=60000)
    pressure.add_argument("--swap-space", type=float, default=48.0)
    checks = ap.add_argument_group("checks")
    checks.add_argument("--skip-reference", action="store_true")
    checks.add_argument("--tie-ulps", type=float, default=2.0,
                        help="a differing answer is a near-tie when the reference's top two logprobs are within this many bf16 steps")
    probe = ap.add_argument_group("demoted-session TTFT probe")
    probe.add_argument("--probe-tokens", type=int, default=32000, help="prompt tokens of the probe (0: skip)")
    probe.add_argument("--probe-decodes", type=int, default=8, help="streams decoding through the probe's restore")
    probe.add_argument("--probe-write-back", action="store_true", help="also probe with write-back from 90 %% pool use")
    probe.add_argument("--probe-only", action="store_true", help="only the probe")
    args = ap.parse_args()
    global LOG_DIR
    LOG_DIR = args.log_dir

    prompts = workload(args)
    # No step-time budget: chunks are cut by --max-num-batched-tokens alone,
    # the same in both runs whatever their step times (a budget fitted on
    # each server's own timings cuts prompts differently, and a different
    # chunking rounds differently: near-ties flip).
    base = ([f"--model={args.model}"] if args.model else []) + [f"--block-size={args.block_size}", "--max-step-ms=0", *args.flags]
    constrained = [f"--num-kv-blocks={args.pool_tokens // args.block_size}", f"--swap-space={args.swap_space}",
                   f"--max-model-len={args.first_max + args.append * args.turns + args.max_tokens + 64}"]
    if args.probe_tokens:
        demoted_turn_ttft(args, base)
        if args.probe_only:
            return 0
    ok = True
    results = {}
    # The reference differs only in the pool (the default, which holds every
    # session) and the host tier: same max model length and step budget.
    same = [f"--max-model-len={args.first_max + args.append * args.turns + args.max_tokens + 64}"]
    for tag, flags in [("constrained", constrained), ("reference", ["--swap-space=0", *same])]:
        if tag == "reference" and args.skip_reference:
            continue
        proc, url = start(args.bin, *base, *flags)
        try:
            model = json.loads(http("GET", url + "/v1/models")[1])["data"][0]["id"]
            answers, failures, wall = run(url, model, prompts, args, tag)
            m = http("GET", url + "/metrics")[1]
            restores = metric(m, "kvc_host_restores_total")
            evicted = {tier: metric_label(m, "kvc_evicted_blocks_total", "tier", tier) for tier in ("host", "dropped")}
            print(f"{tag}: host restores {restores:.0f} blocks, evicted blocks to host {evicted['host']:.0f}, "
                  f"dropped {evicted['dropped']:.0f}")
            for s in range(args.sessions):
                http("DELETE", f"{url}/v1/sessions/{tag}-{args.seed}-{s}")
            m = http("GET", url + "/metrics")[1]
            free, cached, total = (metric(m, n) for n in ("kvc_kv_blocks_free", "kvc_kv_blocks_cached", "kvc_kv_blocks_total"))
            hfree, htotal = metric(m, "kvc_host_kv_blocks_free"), metric(m, "kvc_host_kv_blocks_total")
            print(f"{tag}: after deleting the sessions: device free {free:.0f} + cached {cached:.0f} of {total:.0f}; "
                  f"host free {hfree:.0f} of {htotal:.0f}")
            if failures:
                ok = False
                print("\n".join(failures[:10]))
            if free + cached != total or hfree != htotal:
                ok = False
                print(f"{tag}: FAIL: blocks or host slots not returned")
            if tag == "constrained" and restores == 0:
                ok = False
                print("constrained: FAIL: no block was restored from the host tier (no pressure?)")
            results[tag] = answers
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if "reference" in results:
        a, b = results["constrained"], results["reference"]
        same = sum(1 for k in a if k in b and b[k][0] == a[k][0])
        print(f"answers equal to the reference: {same} of {len(a)}")
        # Where an answer differs, how close the reference's top two
        # candidates were at the first differing token (a near-tie flips
        # under any change of rounding; corrupted KV does not look like one).
        worst = 0.0
        for k in sorted(k for k in a if k in b and b[k][0] != a[k][0]):
            (ta, _), (tb, lb) = a[k], b[k]
            i = next(i for i in range(min(len(ta), len(tb))) if ta[i] != tb[i])
            top = sorted(lb[i].values(), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else float("inf")
            ulps = gap / bf16_step(top[0])
            worst = max(worst, ulps)
            print(f"  session {k[0]} turn {k[1]}: first differs at token {i}; reference top-2 logprob gap {gap:.4f} "
                  f"({ulps:.1f} bf16 steps)")
        if args.concurrency == 1 and same != len(a) and worst > args.tie_ulps:
            ok = False
            print(f"FAIL: an answer differs where the reference's choice was not a near-tie (> {args.tie_ulps} bf16 steps)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def bf16_step(x: float) -> float:
    """The spacing of bf16 values (8 significant bits) around x."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


if __name__ == "__main__":
    sys.exit(main())
