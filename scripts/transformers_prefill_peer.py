#!/usr/bin/env python3
"""Hugging Face transformers' prefill at Qwen3-30B-A3B's shape, the peer of
`kvc-bench engine --shape qwen3-30b-a3b --prefill ...` in the same call.

    python3 scripts/transformers_prefill_peer.py [--lengths 1024,8192,32768] [--attn sdpa]

Random bf16 weights on the GPU (the config of Qwen/Qwen3-30B-A3B, no
download), one sequence per forward pass, logits of the last token only;
median of 3 timed passes after one warm-up. Prints `LEN ms tok/s`.
"""
import argparse
import time

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

CONFIG = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,8192,32768")
    ap.add_argument("--attn", default="sdpa")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    cfg = Qwen3MoeConfig(**CONFIG, max_window_layers=48)
    cfg._attn_implementation = a.attn
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    torch.cuda.synchronize()
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, attn {a.attn}: "
          f"model built in {time.perf_counter() - t0:.1f} s", flush=True)
    with torch.inference_mode():
        for n in lengths:
            ids = torch.randint(10, 150000, (1, n), device="cuda")
            model(ids, use_cache=False, logits_to_keep=1)
            torch.cuda.synchronize()
            times = []
            for _ in range(3):
                t = time.perf_counter()
                model(ids, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            s = sorted(times)[1]
            print(f"{n} {s * 1e3:.1f} {n / s:.0f}", flush=True)


if __name__ == "__main__":
    main()
