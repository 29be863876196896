#!/usr/bin/env python3
"""Does a seeded request sample the same tokens alone, beside concurrent
requests, and after a prefix-cache hit? (issue 33, item 4, on whatever
device the server runs: on the GPU, bf16 kernels may change a row's logits
with the batch's shape.) Standard library only, so it runs on the lent GPU
machine too:

    python3 scripts/seed_repro_check.py --url http://127.0.0.1:8000 --model NAME [--trials 8] [--others 31]

For each trial prompt (distinct token ids, so the first run is a cache
miss), the same seeded request is sent: (1) alone, (2) alone again (its
prompt now cached), (3) beside `--others` concurrent requests of other
prompts. Prints how many of the trials matched (1) token for token in each
case, and where the first difference fell.
"""
import argparse
import concurrent.futures
import json
import random
import urllib.request


def complete(url, model, prompt, seed, max_tokens, temperature=1.0):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "logprobs": 1, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read())
    return out["choices"][0]["logprobs"]["tokens"]


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="default: the first of /v1/models")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--others", type=int, default=31)
    ap.add_argument("--prompt-tokens", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    if not a.model:
        with urllib.request.urlopen(f"{a.url}/v1/models", timeout=30) as r:
            a.model = json.loads(r.read())["data"][0]["id"]
    rng = random.Random(20261202)
    prompt = lambda: [rng.randrange(1000, 100_000) for _ in range(a.prompt_tokens)]
    cached_same = batch_same = 0
    diffs = []
    with concurrent.futures.ThreadPoolExecutor(a.others + 1) as pool:
        for t in range(a.trials):
            p = prompt()
            alone = complete(a.url, a.model, p, 1000 + t, a.max_tokens)
            again = complete(a.url, a.model, p, 1000 + t, a.max_tokens)
            others = [pool.submit(complete, a.url, a.model, prompt(), t, a.max_tokens) for _ in range(a.others)]
            mine = pool.submit(complete, a.url, a.model, p, 1000 + t, a.max_tokens)
            batched = mine.result()
            for o in others:
                o.result()
            cached_same += again == alone
            batch_same += batched == alone
            diffs.append((first_diff(alone, again), first_diff(alone, batched)))
    print(f"{a.trials} seeded requests of {a.max_tokens} tokens (temperature 1, {a.prompt_tokens}-token prompts):")
    print(f"  after a prefix-cache hit: {cached_same}/{a.trials} identical")
    print(f"  beside {a.others} concurrent requests: {batch_same}/{a.trials} identical")
    print(f"  first differing token (cache hit, batched) per trial: {diffs}")


if __name__ == "__main__":
    main()
