#!/usr/bin/env python3
"""Every request of several kvc-replay result directories side by side:
TTFT and path per configuration, matched by run, session and turn.

    python3 scripts/per_request_table.py agentic-dp agentic-naive agentic-kvc > per-request.md

The first directory gives the prompt, new-token and send-time columns
(new = prompt tokens minus the cached tokens that configuration reported).
Session ids end in -r<run>; that suffix is dropped to match runs.
"""
import json
import os
import sys


def load(d):
    rows = {}
    run = 1
    while os.path.exists(f"{d}/run-{run}/metrics.jsonl"):
        with open(f"{d}/run-{run}/metrics.jsonl") as f:
            for line in f:
                m = json.loads(line)
                rows[(run, m["session"].rsplit("-r", 1)[0], m["turn"])] = m
        run += 1
    return rows


def main(dirs):
    if not dirs:
        sys.exit(__doc__)
    data = [load(d) for d in dirs]
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    print(f"| run | session | turn | prompt | new ({names[0]}) | sent at (s, {names[0]}) | " + " | ".join(names) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(dirs))
    for key in sorted(data[0]):
        run, session, turn = key
        m = data[0][key]
        cells = []
        for rows in data:
            x = rows.get(key)
            cells.append(f"{x['ttft_s']:.2f} {x['path']}" if x and x.get("ttft_s") is not None else "–")
        print(f"| {run} | {session} | {turn} | {m['prompt_tokens']} | {m['prompt_tokens'] - (m.get('cached_tokens') or 0)} "
              f"| {m['scheduled_s']:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
