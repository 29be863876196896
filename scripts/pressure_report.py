#!/usr/bin/env python3
"""Issue 29's table: one row per run of scripts/pressure_one_gpu.sh.

    scripts/pressure_report.py RUN.tgz ... [--out DIR]

Each RUN.tgz holds NAME/replay/ (kvc-replay's directory), NAME/metrics-end.txt
(the server's /metrics at the end) and NAME/server.log.gz. Prints a markdown
table: turns completed in the window, TTFT p50/p90/p99, latency mean/p99,
errors and cut turns, prompt tokens computed vs reused (the server's
counters), host restores, evictions by tier and reason, preemptions and the
watchdog's stalled steps. With --out, copies each run's summary.md, plots
and rows there (NAME/), for docs/experiments/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
from pathlib import Path

from prom_text import samples


def family(m: dict[str, float], name: str) -> dict[str, float]:
    return {k: v for k, v in m.items() if k == name or k.startswith(name + "{")}


def fmt(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def load(tgz: Path) -> dict:
    with tarfile.open(tgz) as t:
        files = {m.name: m for m in t.getmembers() if m.isfile()}
        name = next(iter(files)).split("/")[0]

        def read(rel: str) -> bytes | None:
            m = files.get(f"{name}/{rel}")
            return t.extractfile(m).read() if m else None

        rows = [json.loads(line) for line in (read("replay/metrics.jsonl") or b"").decode().splitlines() if line.strip()]
        summary = json.loads(read("replay/summary.json") or b"{}")
        metrics = samples((read("metrics-end.txt") or b"").decode())
        return {"name": name, "rows": rows, "summary": summary, "metrics": metrics, "tar": tgz, "files": files}


def row(r: dict) -> dict:
    rows, m = r["rows"], r["metrics"]
    ok = [x for x in rows if x.get("ok")]
    cut = [x for x in rows if x.get("cut")]
    errors = [x for x in rows if not x.get("ok") and not x.get("cut")]
    # kvc-replay's own percentiles (summary.json), so that the table and
    # the run's summary.md agree.
    ttft, lat = r["summary"].get("ttft_s", {}), r["summary"].get("latency_s", {})
    ev = family(m, "kvc_evicted_blocks_total")
    evictions = ", ".join(f"{k.split('{')[1].rstrip('}').replace('tier=', '').replace('reason=', '').replace(chr(34), '')} {int(v)}"
                          for k, v in sorted(ev.items()) if v > 0) or "0"
    return {
        "run": r["name"],
        "turns": len(ok),
        "ttft_p50": ttft.get("p50"), "ttft_p90": ttft.get("p90"), "ttft_p99": ttft.get("p99"),
        "lat_mean": lat.get("mean"), "lat_p99": lat.get("p99"),
        "errors": len(errors), "cut": len(cut),
        "computed": m.get("kvc_prompt_tokens_computed_total"),
        "reused": m.get("kvc_prompt_tokens_reused_total", 0),
        "restores": m.get("kvc_host_restores_total", 0),
        "evictions": evictions,
        "preemptions": m.get("kvc_preemptions_total", 0),
        "stalled": sum(family(m, "kvc_engine_stalled_steps_total").values()),
        "wall": r["summary"].get("meta", {}).get("wall_s"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    runs = [load(p) for p in a.runs]
    print("| run | turns done | TTFT p50 / p90 / p99 (s) | latency mean / p99 (s) | errors | cut at the end | "
          "prompt tokens computed / reused | host restores (blocks) | evicted blocks (tier reason n) | preemptions | stalled steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        x = row(r)
        print(f"| {x['run']} | {x['turns']} | {fmt(x['ttft_p50'])} / {fmt(x['ttft_p90'])} / {fmt(x['ttft_p99'])} | "
              f"{fmt(x['lat_mean'])} / {fmt(x['lat_p99'])} | {x['errors']} | {x['cut']} | "
              f"{fmt((x['computed'] or 0) / 1e6, 3)}M / {x['reused'] / 1e6:.3f}M | {int(x['restores'])} | {x['evictions']} | "
              f"{int(x['preemptions'])} | {int(x['stalled'])} |")
    if a.out:
        for r in runs:
            dst = a.out / r["name"]
            dst.mkdir(parents=True, exist_ok=True)
            with tarfile.open(r["tar"]) as t:
                for name, m in r["files"].items():
                    rel = name.split("/", 1)[1]
                    keep = rel.startswith("replay/") and rel.rsplit("/", 1)[-1] in (
                        "summary.md", "summary.json", "metrics.jsonl", "scrape.jsonl", "ttft_cdf.svg", "ttft_over_time.svg",
                        "latency_over_time.svg", "pool_usage.svg") or rel in ("metrics-end.txt",)
                    if keep:
                        with open(dst / rel.rsplit("/", 1)[-1], "wb") as f:
                            shutil.copyfileobj(t.extractfile(m), f)


if __name__ == "__main__":
    main()
