#!/usr/bin/env python3
"""Per-kernel GPU time of the ranges kvc-bench marks (KVC_BENCH_PROFILE=tag,...).

ncu run as
    KVC_BENCH_PROFILE=mixed-chunk,graph-1 ncu --profile-from-start off \
        --metrics gpu__time_duration.sum --csv --print-units base --page raw \
        --cache-control none --clock-control none kvc-bench engine ... > ncu.txt 2>&1
prints a "KVC_PROFILE_RANGE tag" line (kvc-bench, stderr) before each
range, in order, and the raw CSV at the end. Each range is one forward
pass, which starts with the embedding lookup (`gather_rows`) followed by
the first layer's `rmsnorm`: this splits the CSV rows there (in launch
order), names the parts by the tags and prints, per range, the kernels
grouped by name: count, total and mean us, share of the range's GPU time.

    python3 scripts/ncu_ranges.py ncu.txt[.gz] [--top 25]
"""
import argparse
import csv
import gzip
import io
import re
from collections import OrderedDict, defaultdict


def short(name):
    name = re.sub(r"\(.*$", "", name)  # arguments
    name = re.sub(r"<.*>", "<...>", name)  # template arguments
    return name[:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    op = gzip.open if a.log.endswith(".gz") else open
    text = op(a.log, "rt", errors="replace").read()
    tags = re.findall(r"^KVC_PROFILE_RANGE (\S+)", text, re.M)
    start = text.find('"ID"')
    rows = list(csv.reader(io.StringIO(text[start:])))
    head, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    col = {h: i for i, h in enumerate(head)}
    ki, ti = col["Kernel Name"], col["gpu__time_duration.sum"]
    bi = col.get("dram__bytes_read.sum")
    names = [short(r[ki]) for r in body]
    starts = [i for i in range(len(names) - 1) if names[i] == "gather_rows" and names[i + 1] == "rmsnorm"]
    print(f"{len(body)} kernels; ranges {tags}; {len(starts)} forward passes start at rows {starts}")
    per = OrderedDict()
    for n, s0 in enumerate(starts):
        tag = tags[n] if n < len(tags) else f"pass-{n}"
        if tags.count(tag) > 1:  # one tag per run of kvc-bench (bf16, fp8, ...)
            tag = f"{tag} (pass {n})"
        end = starts[n + 1] if n + 1 < len(starts) else len(body)
        ks = per.setdefault(tag, defaultdict(lambda: [0, 0.0, 0.0]))
        for r, name in zip(body[s0:end], names[s0:end]):
            try:
                ns = float(r[ti].replace(",", ""))
            except ValueError:
                continue
            ks[name][0] += 1
            ks[name][1] += ns
            if bi is not None:
                try:
                    ks[name][2] += float(r[bi].replace(",", ""))
                except ValueError:
                    pass
    for tag, ks in per.items():
        total = sum(v[1] for v in ks.values())
        n = sum(v[0] for v in ks.values())
        print(f"\n== {tag}: {n} kernels, {total / 1e3:.1f} us of GPU time")
        print(f"{'kernel':<72} {'count':>6} {'total us':>10} {'mean us':>9} {'share':>6} {'MB read':>9} {'GB/s':>6}")
        for k, (c, ns, b) in sorted(ks.items(), key=lambda kv: -kv[1][1])[: a.top]:
            bw = f"{b / ns:>6.0f}" if b else f"{'':>6}"
            print(f"{k[:72]:<72} {c:>6} {ns / 1e3:>10.1f} {ns / c / 1e3:>9.2f} {100 * ns / total:>5.1f}% {b / 1e6:>9.1f} {bw}")


if __name__ == "__main__":
    main()
