#!/usr/bin/env python3
"""Build tiny random Qwen3 / Qwen3-MoE checkpoints with Hugging Face transformers
and record reference logits for the Rust model tests.

Output: crates/model-qwen3/tests/fixtures/<name>/{config.json, *.safetensors, reference.json}
(see crates/model-qwen3/tests/fixtures/README.md for what each fixture covers).

Usage (from the repository root):

    python -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install -r scripts/requirements-reference.txt
    /tmp/refvenv/bin/python scripts/make_reference_fixtures.py            # write + verify
    /tmp/refvenv/bin/python scripts/make_reference_fixtures.py --verify-only

Everything runs on CPU in float32 with fixed seeds, so a rerun with the pinned
versions reproduces the files byte for byte.

reference.json schema:
    {"architecture": "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM",
     "weights_dtype": "float32" | "bfloat16",
     "cases": [{"prompt_ids": [...], "greedy_tokens": [N ints],
                "logits": [N rows of vocab_size floats]}]}
logits[0] are the logits at the last prompt position (prefill);
logits[i] (i >= 1) are the logits of the decode step that fed greedy_tokens[i-1]
through the HF KV cache; greedy_tokens[i] == argmax(logits[i]).
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import shutil
import sys

import numpy as np
import torch

import transformers
from transformers import (
    AutoModelForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from safetensors import safe_open

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "crates", "model-qwen3", "tests", "fixtures")

N_GREEDY = 6  # greedy tokens (and logits rows) per case
PROMPT_LENS = (7, 37)
MIN_TOP2_GAP = 1e-3  # min gap between the two largest output logits at every step
MIN_ROUTER_GAP = 1e-3  # min gap between the k-th and (k+1)-th router logit, every token/MoE layer
INIT_STD = 0.1
# What the hub's transformers-4.x configs say for "transformers_version"
# (Qwen/Qwen3-0.6B and Qwen/Qwen3-30B-A3B both carry 4.51.0).
HUB_TRANSFORMERS_VERSION = "4.51.0"

# ---------------------------------------------------------------------------
# Model sizes. "compact" (the default, used for the committed fixtures) keeps the
# whole fixture set well under 3 MB. "brief" is the size originally proposed
# (vocab 512, hidden 64, ...): same structure, but about 6 MB of fixtures in total.
# ---------------------------------------------------------------------------
PRESET_NAMES = ("compact", "brief")
# field -> its value in each preset, in PRESET_NAMES order
PRESET_SIZES = {
    "vocab_size": (256, 512),
    "hidden_size": (32, 64),
    "num_attention_heads": (4, 4),
    "num_key_value_heads": (2, 2),
    "head_dim": (8, 16),  # heads * head_dim == hidden
    "wide_head_dim": (16, 32),  # heads * head_dim != hidden (used by `dense` and `moe-norm`)
    "intermediate_size": (64, 96),
    "moe_intermediate_size": (16, 32),
}
PRESETS = {name: {k: sizes[i] for k, sizes in PRESET_SIZES.items()} for i, name in enumerate(PRESET_NAMES)}
COMMON = dict(
    num_hidden_layers=3,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    tie_word_embeddings=False,
)
MOE_COMMON = dict(num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])

# name -> spec. "save" is one of:
#   native       save_pretrained() defaults, config.json exactly as transformers writes it
#   hub          save_pretrained() defaults, then config.json rewritten to the hub's 4.x spelling
#   sharded      save_pretrained(max_shard_size=...) giving >= 3 shards + model.safetensors.index.json
#   fused        save_pretrained(save_original_format=False): transformers-5 in-memory fused expert tensors
FIXTURES = {
    "dense": dict(
        arch="dense", seed=1001, save="native", head_dim="wide", rope_theta=10000.0,
    ),
    "dense-tied-hub": dict(
        arch="dense", seed=1002, save="hub", head_dim="std", rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "moe-norm": dict(
        arch="moe", seed=1003, save="native", head_dim="wide", rope_theta=10000.0,
        norm_topk_prob=True,
    ),
    "moe-nonorm-hub": dict(
        arch="moe", seed=1004, save="hub", head_dim="std", rope_theta=1000000.0,
        norm_topk_prob=False,
    ),
    "moe-mlp-only-sharded": dict(
        arch="moe", seed=1005, save="sharded", head_dim="std", rope_theta=10000.0,
        norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1,
    ),
    "moe-sparse-step": dict(
        arch="moe", seed=1006, save="fused", head_dim="std", rope_theta=10000.0,
        norm_topk_prob=True, decoder_sparse_step=2, num_hidden_layers=4,
    ),
    "dense-bf16": dict(
        arch="dense", seed=1007, save="native", head_dim="std", rope_theta=10000.0,
        weights_dtype="bfloat16",
    ),
    # Scaled RoPE: an original window of 12 positions, so the cases (prompts of
    # 7 and 37 tokens, then 6 greedy steps) run to 3.6x past it.
    "dense-yarn": dict(
        arch="dense", seed=1008, save="native", head_dim="wide", rope_theta=10000.0,
        rope=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=12),
        max_position_embeddings=48,
    ),
    "moe-yarn-hub": dict(
        arch="moe", seed=1009, save="hub", head_dim="std", rope_theta=1000000.0,
        norm_topk_prob=True,
        rope=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=12, beta_fast=16.0,
                  beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5),
        max_position_embeddings=48,
    ),
    "dense-linear": dict(
        arch="dense", seed=1010, save="native", head_dim="std", rope_theta=10000.0,
        rope=dict(rope_type="linear", factor=2.0),
    ),
    # Dynamic NTK: transformers raises the base with the sequence's length;
    # vLLM (and kvc) serve one table, at max_position_embeddings x factor.
    # The two agree for a sequence of exactly that length, so the one case is
    # a 48-token prompt over a 12-position window, prefill logits only.
    "dense-dynamic": dict(
        arch="dense", seed=1011, save="native", head_dim="std", rope_theta=10000.0,
        rope=dict(rope_type="dynamic", factor=4.0), max_position_embeddings=12,
        prompt_lens=(48,), n_greedy=1,
    ),
}

DENSE_HUB_KEYS = [
    "architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id",
    "head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
    "max_position_embeddings", "max_window_layers", "model_type", "num_attention_heads",
    "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
    "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache",
    "use_sliding_window", "vocab_size",
]
MOE_HUB_KEYS = [
    "architectures", "attention_bias", "attention_dropout", "bos_token_id", "decoder_sparse_step",
    "eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range",
    "intermediate_size", "max_position_embeddings", "max_window_layers", "mlp_only_layers",
    "model_type", "moe_intermediate_size", "norm_topk_prob", "num_attention_heads", "num_experts",
    "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "output_router_logits",
    "rms_norm_eps", "rope_scaling", "rope_theta", "router_aux_loss_coef", "sliding_window",
    "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache",
    "use_sliding_window", "vocab_size",
]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------
def make_config(spec: dict, preset: dict):
    vocab = preset["vocab_size"]
    kw = dict(COMMON)
    kw.update(
        vocab_size=vocab,
        hidden_size=preset["hidden_size"],
        num_attention_heads=preset["num_attention_heads"],
        num_key_value_heads=preset["num_key_value_heads"],
        head_dim=preset["wide_head_dim"] if spec["head_dim"] == "wide" else preset["head_dim"],
        intermediate_size=preset["intermediate_size"],
        rope_parameters={"rope_type": "default", "rope_theta": float(spec["rope_theta"]), **spec.get("rope", {})},
        # Special ids inside the vocabulary, excluded from prompts and never produced
        # by the recorded greedy continuations (so an EOS stop cannot cut a test short).
        bos_token_id=vocab - 2,
        eos_token_id=vocab - 1,
    )
    for k in ("tie_word_embeddings", "num_hidden_layers", "max_position_embeddings"):
        if k in spec:
            kw[k] = spec[k]
    if spec["arch"] == "dense":
        cfg = Qwen3Config(**kw)
        # hub Qwen3 configs carry max_window_layers == num_hidden_layers (unused: no sliding window)
        cfg.max_window_layers = cfg.num_hidden_layers
    else:
        kw.update(MOE_COMMON)
        kw["moe_intermediate_size"] = preset["moe_intermediate_size"]
        for k in ("norm_topk_prob", "mlp_only_layers", "decoder_sparse_step"):
            if k in spec:
                kw[k] = copy.deepcopy(spec[k])
        cfg = Qwen3MoeConfig(**kw)
    return cfg


def model_class(spec):
    return Qwen3ForCausalLM if spec["arch"] == "dense" else Qwen3MoeForCausalLM


def is_norm_weight(name: str) -> bool:
    return name.endswith("norm.weight")  # input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm


@torch.no_grad()
def build_model(spec, preset):
    cfg = make_config(spec, preset)
    torch.manual_seed(spec["seed"])
    kw = dict(attn_implementation="eager")
    if spec["arch"] == "moe":
        kw["experts_implementation"] = "eager"
    model = model_class(spec)._from_config(cfg, dtype=torch.float32, **kw)
    model.eval()
    # Re-init every parameter so logits are well spread and every norm weight matters.
    gen = torch.Generator().manual_seed(spec["seed"])
    for name, p in model.named_parameters():  # tied params are listed once
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * INIT_STD
        p.copy_(noise + 1.0 if is_norm_weight(name) else noise)
        if spec.get("weights_dtype", "float32") == "bfloat16":
            # Round the weights to bf16-representable values; the reference is computed in
            # f32 with exactly these values. Only the *parameters* are rounded: model.to(bf16)
            # would also round the non-persistent rotary `inv_freq` buffer, which a loader
            # that upcasts bf16 checkpoints to f32 does not do (that costs ~7e-4 in logits).
            p.copy_(p.to(torch.bfloat16).float())
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model


def save_bf16(model, outdir, **kw):
    """save_pretrained with bf16 parameters (buffers untouched, restored to f32 afterwards)."""
    params = list(model.parameters())
    for p in params:
        p.data = p.data.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    try:
        model.save_pretrained(outdir, **kw)
    finally:
        for p in params:
            p.data = p.data.float()
        model.config.dtype = torch.float32


# ---------------------------------------------------------------------------
# reference computation
# ---------------------------------------------------------------------------
class RouterMonitor:
    """Records the smallest gap between the k-th and (k+1)-th router logit seen."""

    def __init__(self, model):
        self.min_gap = float("inf")
        self.handles = []
        for mod in model.modules():
            if type(mod).__name__ == "Qwen3MoeTopKRouter":
                self.handles.append(mod.register_forward_hook(self._hook))

    def _hook(self, mod, inputs, output):
        router_logits = output[0].float()
        top = torch.topk(router_logits, mod.top_k + 1, dim=-1).values
        gap = (top[:, mod.top_k - 1] - top[:, mod.top_k]).min().item()
        self.min_gap = min(self.min_gap, gap)

    def reset(self):
        self.min_gap = float("inf")

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def greedy_with_cache(model, prompt_ids, n=N_GREEDY):
    """Real prefill followed by real single-token decode steps through the HF KV cache."""
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    cache = out.cache
    rows = [out.logits[0, -1].float().clone()]
    tokens = []
    for i in range(n):
        tok = int(torch.argmax(rows[-1]))
        tokens.append(tok)
        if i == n - 1:
            break
        out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
        cache = out.cache
        rows.append(out.logits[0, -1].float().clone())
    return tokens, torch.stack(rows)


@torch.no_grad()
def full_recompute(model, prompt_ids, tokens):
    """Logits of the same positions computed in one no-cache forward pass (sanity check only)."""
    seq = list(prompt_ids) + list(tokens[:-1])
    out = model(input_ids=torch.tensor([seq]), use_cache=False)
    return out.logits[0, len(prompt_ids) - 1:].float()


def min_top2_gap(rows: torch.Tensor) -> float:
    top = torch.topk(rows, 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).min().item()


def make_cases(model, spec, cfg):
    vocab = cfg.vocab_size
    special = {cfg.bos_token_id, cfg.eos_token_id}
    gen = torch.Generator().manual_seed(spec["seed"] * 7 + 13)
    monitor = RouterMonitor(model)
    cases = []
    for plen in spec.get("prompt_lens", PROMPT_LENS):
        for attempt in range(1000):
            prompt = torch.randint(0, vocab - 2, (plen,), generator=gen).tolist()  # ids < bos/eos
            monitor.reset()
            tokens, rows = greedy_with_cache(model, prompt, spec.get("n_greedy", N_GREEDY))
            gap = min_top2_gap(rows)
            rgap = monitor.min_gap
            if gap > MIN_TOP2_GAP and rgap > MIN_ROUTER_GAP and not (set(tokens) & special):
                break
            log(f"    redraw prompt (len {plen}, attempt {attempt}): top2 gap {gap:.2e}, "
                f"router gap {rgap:.2e}, tokens {tokens}")
        else:
            raise RuntimeError("could not find a well-separated prompt")
        full = full_recompute(model, prompt, tokens)
        cache_vs_full = (full - rows).abs().max().item()
        assert cache_vs_full < 1e-4, cache_vs_full
        log(f"    case len={plen}: tokens={tokens} min top2 gap={gap:.3e} "
            f"min router gap={'n/a' if rgap == float('inf') else f'{rgap:.3e}'} "
            f"|cache - nocache|max={cache_vs_full:.2e} |logit|max={rows.abs().max().item():.3f}")
        cases.append(dict(prompt_ids=prompt, greedy_tokens=tokens, logits=rows))
    monitor.remove()
    return cases


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------
def f32_list(t: torch.Tensor):
    """Shortest decimal that round-trips the float32 value (lossless for f32, compact)."""
    return [float(str(x)) for x in t.detach().cpu().numpy().astype(np.float32)]


def write_reference(path, arch, weights_dtype, cases):
    lines = ["{", f' "architecture": {json.dumps(arch)},',
             f' "weights_dtype": {json.dumps(weights_dtype)},', ' "cases": [']
    for ci, c in enumerate(cases):
        lines.append("  {")
        lines.append(f'   "prompt_ids": {json.dumps(c["prompt_ids"])},')
        lines.append(f'   "greedy_tokens": {json.dumps(c["greedy_tokens"])},')
        lines.append('   "logits": [')
        rows = [json.dumps(f32_list(r), separators=(",", ":")) for r in c["logits"]]
        lines.append(",\n".join("    " + r for r in rows))
        lines.append("   ]")
        lines.append("  }" + ("," if ci + 1 < len(cases) else ""))
    lines += [" ]", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    json.load(open(path))  # well-formed


def hub_config(native: dict, arch: str) -> dict:
    """Rewrite a transformers-5 config.json dict into the hub's transformers-4.x spelling."""
    src = dict(native)
    rp = dict(src.pop("rope_parameters"))
    src["rope_theta"] = rp.pop("rope_theta")
    # 4.x: the scaling, if any, under rope_scaling without rope_theta.
    src["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
    src["torch_dtype"] = src.pop("dtype")
    src["transformers_version"] = HUB_TRANSFORMERS_VERSION
    if arch == "moe":
        src["num_experts"] = src.pop("num_local_experts")
        src.setdefault("max_window_layers", src["num_hidden_layers"])  # Qwen3-30B-A3B carries it
        keys = MOE_HUB_KEYS
    else:
        keys = DENSE_HUB_KEYS
    # dropped on purpose: layer_types, pad_token_id (null) -- not in the hub files
    dropped = set(src) - set(keys)
    assert dropped <= {"layer_types", "pad_token_id"}, dropped
    if "layer_types" in src:
        assert all(t == "full_attention" for t in src["layer_types"])
    missing = set(keys) - set(src)
    assert not missing, missing
    return {k: src[k] for k in keys}


def save_fixture(model, spec, outdir):
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    save = spec["save"]
    if save == "sharded":
        total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        model.save_pretrained(outdir, max_shard_size=total // 4)
        shards = glob.glob(os.path.join(outdir, "model-*-of-*.safetensors"))
        assert len(shards) >= 3, shards
        assert os.path.exists(os.path.join(outdir, "model.safetensors.index.json"))
    elif save == "fused":
        model.save_pretrained(outdir, save_original_format=False)
    elif spec.get("weights_dtype") == "bfloat16":
        save_bf16(model, outdir)
    else:
        model.save_pretrained(outdir)
    # generation_config.json is not part of the fixture
    gc = os.path.join(outdir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    cfg_path = os.path.join(outdir, "config.json")
    native = json.load(open(cfg_path))
    if save == "hub":
        with open(cfg_path, "w") as f:
            json.dump(hub_config(native, spec["arch"]), f, indent=2)
            f.write("\n")


def tensor_names(outdir):
    names = {}
    for fn in sorted(glob.glob(os.path.join(outdir, "*.safetensors"))):
        with safe_open(fn, "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                names[k] = (tuple(sl.get_shape()), sl.get_dtype(), os.path.basename(fn))
    return names


def check_layout(spec, cfg, outdir):
    names = tensor_names(outdir)
    has_lm_head = "lm_head.weight" in names
    assert has_lm_head == (not cfg.tie_word_embeddings), (has_lm_head, cfg.tie_word_embeddings)
    if spec["arch"] == "moe":
        for i in range(cfg.num_hidden_layers):
            sparse = i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
            p = f"model.layers.{i}.mlp."
            if not sparse:
                assert p + "gate_proj.weight" in names and p + "gate.weight" not in names
                continue
            assert names[p + "gate.weight"][0] == (cfg.num_experts, cfg.hidden_size)
            if spec["save"] == "fused":
                assert names[p + "experts.gate_up_proj"][0] == (
                    cfg.num_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size)
                assert names[p + "experts.down_proj"][0] == (
                    cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
                assert p + "experts.0.gate_proj.weight" not in names
            else:
                for e in range(cfg.num_experts):
                    assert names[f"{p}experts.{e}.gate_proj.weight"][0] == (cfg.moe_intermediate_size, cfg.hidden_size)
                    assert names[f"{p}experts.{e}.up_proj.weight"][0] == (cfg.moe_intermediate_size, cfg.hidden_size)
                    assert names[f"{p}experts.{e}.down_proj.weight"][0] == (cfg.hidden_size, cfg.moe_intermediate_size)
                assert p + "experts.gate_up_proj" not in names
    want = "BF16" if spec.get("weights_dtype") == "bfloat16" else "F32"
    assert all(v[1] == want for v in names.values())
    return names


# ---------------------------------------------------------------------------
# verification: reload from disk with transformers and recompute
# ---------------------------------------------------------------------------
def verify_fixture(name, spec, outdir):
    ref = json.load(open(os.path.join(outdir, "reference.json")))
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if spec["arch"] == "moe":
        kw["experts_implementation"] = "eager"
    model = AutoModelForCausalLM.from_pretrained(outdir, **kw).eval()
    assert type(model).__name__ == ref["architecture"], (type(model).__name__, ref["architecture"])
    cfg = model.config
    # the config must have been understood exactly (this is what exercises the hub spelling)
    assert cfg.rope_parameters["rope_theta"] == float(spec["rope_theta"]), cfg.rope_parameters
    assert cfg.tie_word_embeddings == spec.get("tie_word_embeddings", False)
    if spec["arch"] == "moe":
        assert cfg.num_experts == 8 and cfg.num_experts_per_tok == 2
        assert cfg.norm_topk_prob == spec["norm_topk_prob"]
        assert cfg.mlp_only_layers == spec.get("mlp_only_layers", [])
        assert cfg.decoder_sparse_step == spec.get("decoder_sparse_step", 1)
        for i, layer in enumerate(model.model.layers):
            sparse = i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
            assert (type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock") == sparse
    worst = 0.0
    for case in ref["cases"]:
        n = spec.get("n_greedy", N_GREEDY)
        tokens, rows = greedy_with_cache(model, case["prompt_ids"], n)
        assert tokens == case["greedy_tokens"], (tokens, case["greedy_tokens"])
        stored = torch.tensor(case["logits"], dtype=torch.float32)
        assert stored.shape == (n, cfg.vocab_size)
        assert [int(torch.argmax(r)) for r in stored] == case["greedy_tokens"]
        worst = max(worst, (rows - stored).abs().max().item())
    assert worst < 1e-5, worst
    extra = ""
    if spec["arch"] == "moe":
        # cross-check the default (grouped_mm) experts implementation as well
        kw.pop("experts_implementation")
        m2 = AutoModelForCausalLM.from_pretrained(outdir, **kw).eval()
        impl = m2.config._experts_implementation
        w2 = 0.0
        for case in ref["cases"]:
            _, rows = greedy_with_cache(m2, case["prompt_ids"])
            w2 = max(w2, (rows - torch.tensor(case["logits"])).abs().max().item())
        assert w2 < 1e-4, w2
        extra = f", experts_implementation={impl}: max |diff|={w2:.2e}"
    log(f"  verify {name}: reload OK, greedy tokens equal, max |logit diff|={worst:.2e}{extra}")


# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="compact")
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    ap.add_argument("--verify-only", action="store_true")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}, preset {args.preset}")
    preset = PRESETS[args.preset]
    names = args.only or list(FIXTURES)
    for name in names:
        spec = FIXTURES[name]
        outdir = os.path.join(args.out, name)
        if not args.verify_only:
            log(f"{name}:")
            model = build_model(spec, preset)
            cfg = model.config
            save_fixture(model, spec, outdir)
            check_layout(spec, cfg, outdir)
            cases = make_cases(model, spec, cfg)
            write_reference(os.path.join(outdir, "reference.json"),
                            "Qwen3ForCausalLM" if spec["arch"] == "dense" else "Qwen3MoeForCausalLM",
                            spec.get("weights_dtype", "float32"), cases)
        verify_fixture(name, spec, outdir)

    total = 0
    for root, _, files in os.walk(args.out):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    log(f"total size of {args.out}: {total} bytes ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    sys.exit(main())
