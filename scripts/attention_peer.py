#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention at kvc-bench attention's shapes.

    python3 scripts/attention_peer.py [--heads 32 --kv-heads 4 --head-dim 128] NAME:LEN/CTX[,LEN/CTX...] ...

Each case is a batch of sequences of LEN new tokens attending causally
(bottom-right aligned) to CTX tokens. Equal lengths run as one dense batch;
unequal ones are not supported here (kvc-bench's cases use equal lengths).
For each backend (flash, cuDNN, efficient) prints `NAME BACKEND MS` or
`NAME BACKEND error: ...`. GQA through enable_gqa; bf16 random inputs;
CUDA events, median of 3 runs of N calls after a warm-up.
"""
import argparse
import sys

import torch

from peer_timing import time_ms
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # older torch
    causal_lower_right = None

BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    torch.manual_seed(0)
    for spec in a.cases:
        name, seqs = spec.split(":")
        pairs = [tuple(int(x) for x in s.split("/")) for s in seqs.split(",")]
        if len(set(pairs)) != 1:
            print(f"{name} - error: unequal sequences not supported by the peer", flush=True)
            continue
        (q_len, ctx), b = pairs[0], len(pairs)
        dev, dt = "cuda", torch.bfloat16
        q = torch.randn(b, a.heads, q_len, a.head_dim, device=dev, dtype=dt)
        k = torch.randn(b, a.kv_heads, ctx, a.head_dim, device=dev, dtype=dt)
        v = torch.randn(b, a.kv_heads, ctx, a.head_dim, device=dev, dtype=dt)
        for bname, backend in BACKENDS:
            if q_len == ctx:
                kw = dict(is_causal=q_len > 1)
            elif q_len == 1:
                kw = {}  # one query at the end attends to everything
            elif causal_lower_right is not None:
                kw = dict(attn_mask=causal_lower_right(q_len, ctx))
            else:
                print(f"{name} {bname} error: this torch has no causal_lower_right", flush=True)
                continue
            try:
                with sdpa_kernel([backend]):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw))
                print(f"{name} {bname} {ms:.6f}", flush=True)
            except Exception as e:  # a backend that refuses the shape
                msg = str(e).replace("\n", " ")[:160]
                print(f"{name} {bname} error: {type(e).__name__}: {msg}", flush=True)
            torch.cuda.synchronize()
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
