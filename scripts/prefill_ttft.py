#!/usr/bin/env python3
"""Time to first token of long prompts through a running kvc-server (or any
OpenAI-compatible server that takes token-id prompts), standard library only.

    python3 scripts/prefill_ttft.py --url http://127.0.0.1:8000 [--lengths 8192,32768] \
        [--append 57344:8192] [--concurrent 4x16384]

- each length: one streamed /v1/completions request of that many random
  token ids, max_tokens 2; prints the TTFT and prompt tok/s;
- --append C:N: a session's first turn of C tokens, then a second turn that
  adds N tokens (the agentic append: the server reuses the session's KV and
  computes only the new chunk over C tokens of context); prints both TTFTs
  and the server's cached/computed counts;
- --concurrent BxN: B prompts of N tokens at once; prints each TTFT and the
  time until the last first token.
"""
import argparse
import json
import random
import threading
import time
import urllib.request


def model_id(url):
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
        return json.load(r)["data"][0]["id"]


def ttft(url, model, ids, session=None, max_tokens=2):
    """Seconds to the first streamed token, and the final usage/kvc fields."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "stream": True, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if session:
        body["session_id"] = session
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    first, info = None, {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if first is None and ev.get("choices") and ev["choices"][0].get("text") is not None:
                first = time.perf_counter() - t0
            if ev.get("usage"):
                info["usage"] = ev["usage"]
            if ev.get("kvc"):
                info["kvc"] = ev["kvc"]
    return first, info


def prompt(n, rng):
    return [rng.randrange(1000, 150000) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--append", default="")
    ap.add_argument("--concurrent", default="")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    model = model_id(a.url)
    ttft(a.url, model, prompt(256, rng))  # warm-up
    for n in [int(x) for x in a.lengths.split(",") if x]:
        t, _ = ttft(a.url, model, prompt(n, rng))
        print(f"prompt {n}: TTFT {t:.3f} s, {n / t:.0f} prompt tok/s", flush=True)
    if a.append:
        c, n = (int(x) for x in a.append.split(":"))
        session = f"append-{rng.randrange(1 << 30)}"
        first = prompt(c, rng)
        t1, _ = ttft(a.url, model, first, session)
        t2, info = ttft(a.url, model, first + prompt(n, rng), session)
        print(f"session turn 1 ({c} tokens): TTFT {t1:.3f} s; turn 2 (+{n} tokens): TTFT {t2:.3f} s, "
              f"{n / t2:.0f} new tok/s; server: {json.dumps(info.get('kvc') or info.get('usage'))}", flush=True)
    if a.concurrent:
        b, n = (int(x) for x in a.concurrent.split("x"))
        prompts = [prompt(n, rng) for _ in range(b)]
        out = [None] * b
        t0 = time.perf_counter()

        def go(i):
            out[i] = ttft(a.url, model, prompts[i])[0]

        threads = [threading.Thread(target=go, args=(i,)) for i in range(b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        print(f"{b} concurrent prompts of {n}: TTFTs {', '.join(f'{x:.2f}' for x in sorted(out))} s; "
              f"last first token after {wall:.2f} s, {b * n / wall:.0f} prompt tok/s", flush=True)


if __name__ == "__main__":
    main()
