#!/usr/bin/env bash
# Writes a model directory for `kvc-server --model DIR --load-format dummy`
# at Qwen3-30B-A3B's exact shape (random weights, no safetensors needed):
#
#   scripts/make_model_dir.sh DIR          # e.g. .gpu/qwen3-30b-a3b
#
# DIR gets:
#   config.json             the shape of QWEN3_30B_A3B in
#                           crates/model-qwen3/src/config.rs, except
#                           max_position_embeddings (see below)
#   generation_config.json  Qwen3's EOS ids (<|im_end|>, <|endoftext|>)
#   tokenizer files         the real Qwen3 tokenizer, copied from
#                           $TOKENIZER_DIR (default /work/shared/data/qwen3-tokenizer):
#                           tokenizer.json, tokenizer_config.json, vocab.json,
#                           merges.txt, whichever are present (tokenizer.json
#                           is required)
#
# max_position_embeddings is the checkpoint's 40960, and rope_scaling is
# the YaRN entry Qwen3's model card documents for long contexts (factor 4
# over the original 32768): kvc then serves 32768 x 4 = 131072 tokens, as
# vLLM derives it, with the scaled frequencies on the CPU and CUDA paths
# alike. The agentic workload's sessions reach ~100K tokens; YaRN changes
# the RoPE frequencies, not the cost of a forward pass.
set -euo pipefail

if [ $# -ne 1 ] || [ "${1:0:1}" = - ]; then
    echo "usage: $0 DIR   (env TOKENIZER_DIR: source of the Qwen3 tokenizer files)" >&2
    exit 2
fi
DIR=$1
TOKENIZER_DIR=${TOKENIZER_DIR:-/work/shared/data/qwen3-tokenizer}

if [ ! -f "$TOKENIZER_DIR/tokenizer.json" ]; then
    echo "$0: $TOKENIZER_DIR/tokenizer.json not found (set TOKENIZER_DIR)" >&2
    exit 1
fi
mkdir -p "$DIR"

# Keep in sync with QWEN3_30B_A3B (crates/model-qwen3/src/config.rs);
# rope_scaling is added (see above).
cat > "$DIR/config.json" <<'EOF'
{
  "architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe",
  "vocab_size": 151936,
  "hidden_size": 2048,
  "intermediate_size": 6144,
  "moe_intermediate_size": 768,
  "num_hidden_layers": 48,
  "num_attention_heads": 32,
  "num_key_value_heads": 4,
  "head_dim": 128,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "norm_topk_prob": true,
  "decoder_sparse_step": 1,
  "mlp_only_layers": [],
  "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "bos_token_id": 151643,
  "eos_token_id": 151645
}
EOF

# As Qwen3 checkpoints ship it (only eos_token_id matters to kvc).
cat > "$DIR/generation_config.json" <<'EOF'
{
  "bos_token_id": 151643,
  "eos_token_id": [151645, 151643]
}
EOF

copied=""
for f in tokenizer.json tokenizer_config.json vocab.json merges.txt; do
    if [ -f "$TOKENIZER_DIR/$f" ]; then
        cp -f "$TOKENIZER_DIR/$f" "$DIR/$f" && chmod 644 "$DIR/$f"
        copied="$copied $f"
    fi
done
echo "wrote $DIR: config.json generation_config.json$copied"
