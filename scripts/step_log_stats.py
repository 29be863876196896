#!/usr/bin/env python3
"""Step times from a kvc-server log written with
RUST_LOG=info,kvc_engine::engine_loop::step=debug (one `event="step"` line
per engine step): how long steps took against their budget and the model's
prediction, and the time between steps (the loop's own work).

    python3 scripts/step_log_stats.py server.log
"""
import datetime
import re
import sys

from load_report import pct as pct_or_none


def pct(v, q):
    p = pct_or_none(v, q)
    return float("nan") if p is None else p


def main():
    rows = []
    for line in open(sys.argv[1]):
        if 'event="step"' not in line:
            continue
        f = dict(re.findall(r"(\w+)=([0-9.e+-]+)", line))
        ts = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
        rows.append((ts, {k: float(v) for k, v in f.items()}))
    if not rows:
        print("no step events")
        return
    took = [r["took_ms"] for _, r in rows]
    mixed = [r["took_ms"] for _, r in rows if r["decodes"] > 0 and r["prefill_tokens"] > 0]
    err = [(r["predicted_ms"] - r["took_ms"]) / r["took_ms"] for _, r in rows if r["took_ms"] > 0 and r["budget_ms"] > 0]
    gaps = [(t1 - t0) * 1e3 - r1["took_ms"] for (t0, _), (t1, r1) in zip(rows, rows[1:])]
    gaps = [g for g in gaps if g < 1000]  # idle periods are not overhead
    print(f"steps {len(rows)}; took p50 {pct(took, .5):.1f} p90 {pct(took, .9):.1f} p99 {pct(took, .99):.1f} ms; "
          f"mixed steps {len(mixed)} p50 {pct(mixed, .5):.1f} p99 {pct(mixed, .99):.1f} ms; "
          f"prediction error p50 {100 * pct(err, .5):+.0f}% p10 {100 * pct(err, .1):+.0f}% p90 {100 * pct(err, .9):+.0f}%; "
          f"between steps p50 {pct(gaps, .5):.1f} p90 {pct(gaps, .9):.1f} p99 {pct(gaps, .99):.1f} ms")


if __name__ == "__main__":
    main()
