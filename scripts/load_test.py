#!/usr/bin/env python3
"""Load test: N concurrent streaming chat clients against a kvc-server on
loopback, a fraction of them disconnecting mid-stream.

Checks (exit 1 if any fails): no 5xx and no transport error, every
completed stream well-formed (role chunk first, content deltas, one finish
chunk, usage chunk, `data: [DONE]` last, no stray lines), and afterwards the
KV pool back to its initial free count (after POST /reset_prefix_cache,
which drops the prefix cache's reclaimable blocks).

    .venv/bin/python scripts/load_test.py --base-url http://127.0.0.1:8000 \\
        --clients 500 --disconnect-fraction 0.1 --max-tokens 16
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx

from prom_text import samples


def metrics(base: str) -> dict:
    return samples(httpx.get(f"{base}/metrics", timeout=30).text)


async def one_client(client, base, i, disconnect, max_tokens, result):
    body = {
        "messages": [{"role": "user", "content": f"Client {i}: tell me something about the number {i * 7919 % 1000}."}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": i,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.monotonic()
    first = None
    events = []
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                result.append({"i": i, "status": r.status_code, "error": (await r.aread()).decode(errors="replace")[:200]})
                return
            cut_after = random.Random(i).randint(1, max(1, max_tokens // 2)) if disconnect else None
            async for line in r.aiter_lines():
                if not line or line.startswith(":"):
                    continue  # SSE separators and keep-alive comments
                if first is None and '"content":"' in line and '"content":""' not in line:
                    first = time.monotonic() - t0  # first generated text
                events.append(line)
                if cut_after is not None and len(events) >= cut_after + 1:
                    break  # leave mid-stream: the connection is closed
        result.append({"i": i, "status": 200, "disconnected": disconnect, "events": events,
                       "ttft": first, "latency": time.monotonic() - t0})
    except Exception as e:  # noqa: BLE001 - every failure is reported
        result.append({"i": i, "status": None, "error": f"{type(e).__name__}: {e}"})


def well_formed(events, max_tokens) -> str | None:
    """None if the SSE stream is a complete, well-formed OpenAI stream."""
    if not events or events[-1] != "data: [DONE]":
        return "does not end with [DONE]"
    chunks = []
    for e in events[:-1]:
        if not e.startswith("data: "):
            return f"stray line {e[:60]!r}"
        chunks.append(json.loads(e[6:]))
    if chunks[0]["choices"][0]["delta"].get("role") != "assistant":
        return "first chunk has no role"
    finishes = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    if len(finishes) != 1:
        return f"{len(finishes)} finish chunks"
    usage = chunks[-1].get("usage")
    if chunks[-1]["choices"] != [] or not usage or usage["completion_tokens"] != max_tokens:
        return f"bad usage chunk {chunks[-1]}"
    return None


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--disconnect-fraction", type=float, default=0.1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--deadline-s", type=float, default=600)
    a = ap.parse_args()
    base = a.base_url
    initial = metrics(base)
    disconnecting = set(random.Random(0).sample(range(a.clients), int(a.clients * a.disconnect_fraction)))
    result = []
    limits = httpx.Limits(max_connections=a.clients + 10, max_keepalive_connections=0)
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(a.deadline_s), limits=limits) as client:
        await asyncio.wait_for(asyncio.gather(*[
            one_client(client, base, i, i in disconnecting, a.max_tokens, result) for i in range(a.clients)
        ]), a.deadline_s)
    wall = time.monotonic() - t0
    failures = [r for r in result if r["status"] != 200]
    completed = [r for r in result if r["status"] == 200 and not r["disconnected"]]
    malformed = [(r["i"], why) for r in completed if (why := well_formed(r["events"], a.max_tokens))]
    # Wait (bounded) for the engine to notice the disconnects and go idle.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = metrics(base)
        if m["kvc_requests_running"] == 0 and m["kvc_requests_waiting"] == 0:
            break
        await asyncio.sleep(0.1)
    before_reset = metrics(base)
    httpx.post(f"{base}/reset_prefix_cache", timeout=30)
    after = metrics(base)
    ttft = sorted(r["ttft"] for r in completed if r["ttft"] is not None)
    lat = sorted(r["latency"] for r in completed)
    pct = lambda v, p: v[min(len(v) - 1, int(round((len(v) - 1) * p)))] if v else float("nan")
    report = {
        "clients": a.clients,
        "disconnecting": len(disconnecting),
        "completed": len(completed),
        "failed": len(failures),
        "server_5xx": sum(1 for r in failures if r["status"] and r["status"] >= 500),
        "malformed_streams": len(malformed),
        "wall_s": round(wall, 2),
        "output_tok_per_s": round(len(completed) * a.max_tokens / wall, 1),
        "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p99_s": round(pct(ttft, 0.99), 3),
        "latency_p50_s": round(pct(lat, 0.5), 3), "latency_p99_s": round(pct(lat, 0.99), 3),
        "latency_mean_s": round(statistics.mean(lat), 3) if lat else None,
        "cancelled_streams_counted": after.get("kvc_streams_cancelled_total"),
        "kv_free_initial": initial["kvc_kv_blocks_free"],
        "kv_free_plus_evictable_after": before_reset["kvc_kv_blocks_free"] + before_reset["kvc_kv_blocks_evictable"],
        "kv_free_after_reset": after["kvc_kv_blocks_free"],
    }
    print(json.dumps(report, indent=2))
    for f in failures[:5]:
        print("failure:", f, file=sys.stderr)
    for m in malformed[:5]:
        print("malformed:", m, file=sys.stderr)
    ok = not failures and not malformed and after["kvc_kv_blocks_free"] == initial["kvc_kv_blocks_free"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
