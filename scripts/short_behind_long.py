#!/usr/bin/env python3
"""A short prompt arriving while a long one is being prefilled, through a
running kvc-server (standard library only; prompts of random token ids, so
no cache helps):

    python3 scripts/short_behind_long.py --url http://127.0.0.1:8000 \
        --long 32768 --short 1000 [--short-max-tokens 8] [--at 0.3] [--repeat 3]

Measures, each the median of --repeat runs:
- idle: the short prompt's TTFT with nothing else running;
- alone: the long prompt's TTFT with nothing else running;
- mixed: the long prompt sent, the short one sent --at x (alone's TTFT)
  later; both TTFTs.
Prints the ratios issue 17 bounds: short mixed / idle (<= 3) and long
mixed / alone (<= 1.25).
"""
import argparse
import json
import random
import statistics
import threading
import time

from prefill_ttft import model_id, prompt, ttft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--long", type=int, default=32768)
    ap.add_argument("--short", type=int, default=1000)
    ap.add_argument("--short-max-tokens", type=int, default=8)
    ap.add_argument("--at", type=float, default=0.3, help="short sent at this fraction of the long one's TTFT alone")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None, help="prompt tokens' seed (default: random, so no run hits an earlier one's cache)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    model = model_id(a.url)
    ttft(a.url, model, prompt(256, rng))  # warm-up
    idle = statistics.median(ttft(a.url, model, prompt(a.short, rng), max_tokens=a.short_max_tokens)[0] for _ in range(a.repeat))
    alone = statistics.median(ttft(a.url, model, prompt(a.long, rng))[0] for _ in range(a.repeat))
    shorts, longs = [], []
    for _ in range(a.repeat):
        res = {}
        long_ids, short_ids = prompt(a.long, rng), prompt(a.short, rng)
        t = threading.Thread(target=lambda: res.__setitem__("long", ttft(a.url, model, long_ids)[0]))
        t.start()
        time.sleep(a.at * alone)
        res["short"] = ttft(a.url, model, short_ids, max_tokens=a.short_max_tokens)[0]
        t.join()
        shorts.append(res["short"])
        longs.append(res["long"])
    out = {
        "long_tokens": a.long, "short_tokens": a.short, "short_max_tokens": a.short_max_tokens, "at": a.at,
        "short_idle_ttft_s": idle, "long_alone_ttft_s": alone,
        "short_mixed_ttft_s": statistics.median(shorts), "long_mixed_ttft_s": statistics.median(longs),
    }
    out["short_ratio"] = out["short_mixed_ttft_s"] / idle
    out["long_ratio"] = out["long_mixed_ttft_s"] / alone
    print(json.dumps(out, indent=1))
    print(f"| {a.long} + {a.short} | {idle:.3f} s | {out['short_mixed_ttft_s']:.3f} s ({out['short_ratio']:.1f}x) "
          f"| {alone:.3f} s | {out['long_mixed_ttft_s']:.3f} s ({out['long_ratio']:.2f}x) |", flush=True)


if __name__ == "__main__":
    main()
