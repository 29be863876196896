#!/usr/bin/env python3
"""PyTorch's torch._grouped_mm at kvc-bench moe's shapes.

    python3 scripts/moe_peer.py [--experts 128 --top-k 8 --hidden 2048 --inter 768] TOKENS ...

For T tokens, top-k rows each spread evenly over the experts (the first
experts take the remainder), times the two grouped projections of a MoE
block on rows already in expert order: gate/up ([rows, hidden] x
[experts, hidden, 2 inter]) then down ([rows, inter] x [experts, inter,
hidden]), bf16, weights stored [experts, out, in] as checkpoints store them
(passed transposed, so K-major). torch._grouped_mm is CUTLASS's sm90
grouped GEMM in PyTorch >= 2.8. Prints `T grouped_mm MS` or
`T grouped_mm error: ...`; CUDA events, median of 3 runs after a warm-up.
"""
import argparse

import torch

from peer_timing import time_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("tokens", nargs="+", type=int)
    a = ap.parse_args()
    torch.manual_seed(0)
    e, h, i = a.experts, a.hidden, a.inter
    dev = "cuda"
    gate_up = (torch.randn(e, 2 * i, h, device=dev) * 0.02).to(torch.bfloat16)
    down = (torch.randn(e, h, i, device=dev) * 0.02).to(torch.bfloat16)
    for t in a.tokens:
        rows = t * a.top_k
        counts = [rows // e + (1 if x < rows % e else 0) for x in range(e)]
        offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
        xs = torch.randn(rows, h, device=dev).to(torch.bfloat16)
        act = torch.randn(rows, i, device=dev).to(torch.bfloat16)
        wg, wd = gate_up.transpose(-2, -1), down.transpose(-2, -1)

        def call():
            torch._grouped_mm(xs, wg, offs=offs)
            torch._grouped_mm(act, wd, offs=offs)

        try:
            print(t, "grouped_mm", f"{time_ms(call):.4f}", flush=True)
        except Exception as ex:  # the kernel refused the shape, or no _grouped_mm
            print(t, "grouped_mm", "error:", str(ex).splitlines()[0], flush=True)


if __name__ == "__main__":
    main()
