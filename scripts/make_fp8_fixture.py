#!/usr/bin/env python3
"""Build the block-FP8 fixture `moe-norm-fp8` from the `moe-norm` fixture and
record what Hugging Face transformers answers for it (issue 35: "loaded by kvc
and by transformers").

The quantization is the one transformers' FineGrainedFP8Config and Qwen's
official FP8 checkpoints use, at a block size the tiny model's matrices hold
several of: every decoder projection (attention q/k/v/o, each expert's
gate/up/down) in blocks of BLOCK x BLOCK, scale = amax / 448 per block, the
weight stored as float8_e4m3fn of w / scale and the scale as
`<name>_scale_inv` (f32, [ceil(N / BLOCK), ceil(K / BLOCK)]); embeddings,
norms, router and LM head stay as they are; config.json gains
`quantization_config` {quant_method fp8, fmt e4m3, activation_scheme dynamic,
weight_block_size [BLOCK, BLOCK]}.

The reference is transformers loading that directory on the CPU (no GPU
visible, so its fine-grained FP8 quantizer dequantizes the weights at load)
and scoring moe-norm's prompts: logits at the last prompt position, then
after each greedy token (computed without a KV cache, so the script does not
depend on the cache API of one transformers version). Before it records
anything, the script checks that transformers dequantized every weight to
q x scale as this script means it (so kvc and transformers read the format
alike, not only kvc and this script).

Usage (from the repository root; needs torch, transformers, safetensors,
numpy; CPU only):

    python3 scripts/make_fp8_fixture.py [--out crates/model-qwen3/tests/fixtures]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO_ROOT, "crates", "model-qwen3", "tests", "fixtures")
SOURCE = "moe-norm"
NAME = "moe-norm-fp8"
BLOCK = 16
E4M3_MAX = 448.0


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def quantized(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def quantize(w: torch.Tensor):
    """(e4m3 weight, f32 scales per BLOCK x BLOCK block, the dequantized f32 weight)."""
    n, k = w.shape
    sr, sc = -(-n // BLOCK), -(-k // BLOCK)
    scale = torch.ones(sr, sc, dtype=torch.float32)
    for i in range(sr):
        for j in range(sc):
            amax = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].abs().max().item()
            if amax > 0:
                scale[i, j] = amax / E4M3_MAX
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]
    q = (w.float() / full).to(torch.float8_e4m3fn)
    return q, scale, q.float() * full


def write_checkpoint(out: str):
    src = os.path.join(FIXTURES, SOURCE)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    stored, dequantized = {}, {}
    for name, t in sorted(tensors.items()):
        if quantized(name):
            q, s, d = quantize(t)
            stored[name], stored[name + "_scale_inv"] = q.contiguous(), s.contiguous()
            dequantized[name] = d
        else:
            stored[name] = t.contiguous()
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    save_file(stored, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(src, "config.json")))
    config["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK],
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    log(f"{NAME}: {len(dequantized)} projections in FP8 ({BLOCK}x{BLOCK} blocks)")
    return dequantized


def weight_of(state, name):
    """`name` in transformers' state dict, or its slice of the fused experts
    (`experts.gate_up_proj` [E, 2I, H], gate rows first; `experts.down_proj`
    [E, H, I]) where transformers fuses them at load."""
    if name in state:
        return state[name]
    m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", name)
    if not m:
        return None
    base, e, which = m.group(1), int(m.group(2)), m.group(3)
    if which == "down":
        return state[base + ".down_proj"][e] if base + ".down_proj" in state else None
    if base + ".gate_up_proj" not in state:
        return None
    gu = state[base + ".gate_up_proj"][e]
    half = gu.shape[0] // 2
    return gu[:half] if which == "gate" else gu[half:]


def check_dequantized(model, dequantized):
    """transformers' weights are this script's q x scale (as f32 or as its bf16 rounding)."""
    state = model.state_dict()
    worst, dtypes = 0.0, set()
    for name, want in dequantized.items():
        got = weight_of(state, name)
        if got is not None and got.shape != want.shape and got.t().shape == want.shape:
            got = got.t()
        if got is None:
            raise SystemExit(f"transformers' model has no {name}: cannot check how it dequantized it "
                             f"(its names: {sorted(state)[:8]} ...)")
        dtypes.add(str(got.dtype))
        if got.dtype == torch.float8_e4m3fn:
            raise SystemExit(f"transformers kept {name} in FP8 on the CPU: no dequantized reference")
        rel = ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, rel)
    # bf16 keeps 8 bits of mantissa: 2^-8 relative to the block's largest value at worst.
    if worst > 2.0 ** -8:
        raise SystemExit(f"transformers' dequantized weights differ from q x scale by {worst:.3e} (relative)")
    log(f"transformers dequantized {len(dequantized)} weights to {sorted(dtypes)}: worst relative difference "
        f"from q x scale {worst:.2e}")
    return sorted(dtypes)


@torch.no_grad()
def score(model, prompt, n):
    """(greedy tokens, logits rows): the last prompt position, then after each greedy token."""
    seq, tokens, rows = list(prompt), [], []
    for _ in range(n):
        row = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        rows.append(row)
        tokens.append(int(torch.argmax(row)))
        seq.append(tokens[-1])
    return tokens, torch.stack(rows)


def f32_list(t: torch.Tensor):
    return [float(str(x)) for x in t.detach().cpu().numpy().astype(np.float32)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=FIXTURES, help="folder to write moe-norm-fp8/ into")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda visible: {torch.cuda.is_available()}")
    out = os.path.join(args.out, NAME)
    dequantized = write_checkpoint(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    dtypes = check_dequantized(model, dequantized)
    source = json.load(open(os.path.join(FIXTURES, SOURCE, "reference.json")))
    cases = []
    for case in source["cases"]:
        tokens, rows = score(model, case["prompt_ids"], len(case["greedy_tokens"]))
        top = torch.topk(rows, 2, dim=-1).values
        log(f"  prompt of {len(case['prompt_ids'])}: greedy {tokens} (moe-norm's {case['greedy_tokens']}), "
            f"min top-2 gap {(top[:, 0] - top[:, 1]).min().item():.3e}")
        cases.append({"prompt_ids": case["prompt_ids"], "greedy_tokens": tokens, "logits": [f32_list(r) for r in rows]})
    reference = {
        "architecture": source["architecture"],
        "weights_dtype": "float8_e4m3fn",
        "reference": f"transformers {transformers.__version__} (torch {torch.__version__}), CPU, weights dequantized "
                     f"at load to {', '.join(dtypes)}",
        "cases": cases,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    log(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    sys.exit(main())
