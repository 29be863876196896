#!/usr/bin/env python3
"""One row of the serving-under-load table from a `kvc-replay run` directory
and the server's /metrics text taken after the run (standard library only).

    python3 scripts/load_report.py --run DIR --metrics metrics.txt \
        --capacity TOK_PER_S --offered TOK_PER_S [--label 70%]

Prints a JSON object and a markdown row:
- finished: requests that ended without error, of all sent;
- TTFT p50/p99 over finished requests (client side, metrics.jsonl);
- ITL p50/p99 over every token gap (the server's
  kvc_inter_token_latency_seconds histogram, interpolated within buckets
  as Prometheus' histogram_quantile does), and the share of gaps <= 40 ms
  and <= 150 ms (bucket edges);
- preemptions, tokens recomputed after preemption over prompt tokens
  computed (kvc_preempted_tokens_recomputed_total /
  kvc_prompt_tokens_computed_total);
- completed prompt tokens/s: prompt tokens computed for finished requests
  over the time from the first request sent to the last one finished, and
  that over the capacity; beside it, every prompt token the engine computed
  over that time and the share lost to requests that did not finish;
- unfinished requests by cause: 429 (refused at the door), another status,
  none (the client's timeout).
"""
import argparse
import json
import re


def quantile(buckets, q):
    """buckets: sorted [(le, cumulative count)] ending with +Inf."""
    total = buckets[-1][1]
    if total == 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--metrics-before", help="/metrics before the run: counters and buckets are taken as differences")
    ap.add_argument("--capacity", type=float, required=True)
    ap.add_argument("--offered", type=float, required=True, help="offered uncached prompt tok/s")
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    rows = [json.loads(l) for l in open(f"{a.run}/metrics.jsonl") if l.strip()]
    ok = [r for r in rows if r.get("ok")]
    text = open(a.metrics).read()
    before = open(a.metrics_before).read() if a.metrics_before else ""

    def value(t, key):
        m = re.search(rf"^{re.escape(key)} ([0-9.e+-]+)$", t, re.M)
        return float(m.group(1)) if m else None

    def scalar(name):
        v = value(text, name)
        return None if v is None else v - (value(before, name) or 0.0)

    buckets = []
    for m in re.finditer(r'^kvc_inter_token_latency_seconds_bucket\{le="([^"]+)"\} ([0-9.e+-]+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        key = f'kvc_inter_token_latency_seconds_bucket{{le="{m.group(1)}"}}'
        buckets.append((le, float(m.group(2)) - (value(before, key) or 0.0)))
    buckets.sort()
    share = {le: c / buckets[-1][1] for le, c in buckets} if buckets and buckets[-1][1] else {}

    start = min(r["start_s"] for r in rows)
    end = max(r["start_s"] + r["latency_s"] for r in ok) if ok else start
    computed_ok = sum(r.get("computed_tokens") or r["prompt_tokens"] for r in ok)
    recomputed = scalar("kvc_preempted_tokens_recomputed_total") or 0.0
    computed_all = scalar("kvc_prompt_tokens_computed_total") or 0.0
    out = {
        "label": a.label,
        "sent": len(rows),
        "finished": len(ok),
        "errors": len(rows) - len(ok),
        "statuses": sorted({r.get("status") for r in rows if not r.get("ok")} - {None}),
        # Unfinished requests by cause: refused at the door (429, e.g.
        # --max-queue-delay-s), another HTTP status, or no status (the
        # client's timeout or a broken stream).
        "refused_429": sum(1 for r in rows if not r.get("ok") and r.get("status") == 429),
        "other_status": sum(1 for r in rows if not r.get("ok") and r.get("status") not in (None, 200, 429)),
        "no_status": sum(1 for r in rows if not r.get("ok") and r.get("status") in (None, 200)),
        "ttft_p50_s": pct([r["ttft_s"] for r in ok if r.get("ttft_s") is not None], 0.5),
        "ttft_p99_s": pct([r["ttft_s"] for r in ok if r.get("ttft_s") is not None], 0.99),
        "itl_p50_s": quantile(buckets, 0.5) if buckets else None,
        "itl_p99_s": quantile(buckets, 0.99) if buckets else None,
        "itl_share_le_40ms": share.get(0.04),
        "itl_share_le_150ms": share.get(0.15),
        "preemptions": scalar("kvc_preemptions_total"),
        "recomputed_tokens": recomputed,
        "computed_prompt_tokens": computed_all,
        "recompute_share": recomputed / computed_all if computed_all else None,
        "duration_s": end - start,
        "completed_prompt_tok_per_s": computed_ok / (end - start) if end > start else None,
        # Prompt tokens the engine computed over that time, and the share of
        # them spent on requests that did not finish (e.g. timed out queued).
        "computed_prompt_tok_per_s": computed_all / (end - start) if end > start else None,
        "lost_prefill_share": max(0.0, 1 - computed_ok / computed_all) if computed_all else None,
        # Step-kind decisions (--itl-target-ms), by kind/reason, where counted.
        "step_kinds": {
            f"{m.group(1)}/{m.group(2)}": float(m.group(3)) - (value(before, m.group(0).rsplit(" ", 1)[0]) or 0.0)
            for m in re.finditer(r'^kvc_decisions_total\{decision="step_kind",outcome="([^"]+)",reason="([^"]+)"\} ([0-9.e+-]+)$', text, re.M)
        },
        "capacity_tok_per_s": a.capacity,
        "offered_tok_per_s": a.offered,
    }
    out["completed_over_capacity"] = (out["completed_prompt_tok_per_s"] or 0) / a.capacity
    print(json.dumps(out, indent=1))
    f = lambda v, n=2: "-" if v is None else f"{v:.{n}f}"
    print(f"| {a.label} ({a.offered / a.capacity:.0%} of {a.capacity / 1000:.1f}K tok/s) | {len(ok)} of {len(rows)} "
          f"| {f(out['ttft_p50_s'])} / {f(out['ttft_p99_s'])} s | {f((out['itl_p50_s'] or 0) * 1000, 0)} / {f((out['itl_p99_s'] or 0) * 1000, 0)} ms "
          f"| {f(out['itl_share_le_40ms'], 3)} / {f(out['itl_share_le_150ms'], 3)} | {int(out['preemptions'] or 0)} "
          f"| {f(100 * (out['recompute_share'] or 0), 2)} % | {f((out['completed_prompt_tok_per_s'] or 0) / 1000, 1)}K ({out['completed_over_capacity']:.0%}) |")


if __name__ == "__main__":
    main()
