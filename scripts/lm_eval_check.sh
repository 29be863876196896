#!/usr/bin/env bash
# lm-eval against kvc, end to end: the pinned lm-eval runs its
# `local-completions` model (echo + logprobs loglikelihood requests, token
# lists, batched) on a tiny local multiple-choice task
# (scripts/lm_eval/kvc_tiny_mc.*) against kvc-server on the embedded
# model; then every request's loglikelihood and is_greedy, as lm-eval logged
# them, are compared with the same model scored outside the server by
# kvc-score (one plain CPU forward pass per sequence) within 1e-3.
#
#   scripts/lm_eval_check.sh [OUT_DIR]     (default runs/lm_eval_check)
#
# Not part of CI: lm-eval and transformers (for its Hugging Face tokenizer
# backend; no torch) go into their own venv, .lm-eval-venv. Needs network
# access to PyPI the first time only. Exits non-zero when a request differs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-$ROOT/runs/lm_eval_check}"
VENV="$ROOT/.lm-eval-venv"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
PINS=("lm-eval[api]==0.4.13" "transformers==5.23.0")
SEED=0

mkdir -p "$OUT"
if [ ! -x "$VENV/bin/lm_eval" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
fi
"$VENV/bin/pip" freeze > "$OUT/pip-freeze.txt"

cargo build -q -p kvc-server -p kvc-engine --bin kvc-server --bin kvc-score

# The embedded model's tokenizer as a Hugging Face tokenizer directory
# (lm-eval tokenizes contexts and continuations itself).
TOK="$OUT/tokenizer"
mkdir -p "$TOK"
gzip -dc crates/text-front/assets/qwen3/tokenizer.json.gz > "$TOK/tokenizer.json"
cp crates/text-front/assets/qwen3/tokenizer_config.json "$TOK/"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$TARGET/debug/kvc-server" --host 127.0.0.1 --port "$PORT" --seed "$SEED" > "$OUT/kvc-server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $SERVER 2>/dev/null || { tail -20 "$OUT/kvc-server.log"; exit 1; }
    sleep 0.2
done

HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false "$VENV/bin/lm_eval" \
    --model local-completions \
    --model_args "base_url=http://127.0.0.1:$PORT/v1/completions,model=kvc-default,tokenizer_backend=huggingface,tokenizer=$TOK,num_concurrent=1,max_retries=1" \
    --batch_size 4 \
    --include_path scripts/lm_eval \
    --tasks kvc_tiny_mc \
    --output_path "$OUT/results" \
    --log_samples 2>&1 | tee "$OUT/lm_eval.log"

SAMPLES=$(find "$OUT/results" -name 'samples_kvc_tiny_mc_*.jsonl' -newer "$OUT/pip-freeze.txt" | sort | tail -1)
[ -n "$SAMPLES" ] || { echo "lm_eval_check: no samples file under $OUT/results"; exit 1; }

# Every request lm-eval made, tokenized as lm-eval does (`_encode_pair`),
# scored by kvc-score, compared.
"$VENV/bin/python" - "$SAMPLES" "$TOK" "$TARGET/debug/kvc-score" "$SEED" "$OUT/comparison.jsonl" <<'PY'
import json, subprocess, sys
from transformers import AutoTokenizer

samples_path, tok_dir, scorer, seed, out_path = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(tok_dir)

def encode_pair(context, continuation):
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    return ctx, whole[len(ctx):]

requests = []
for line in open(samples_path):
    s = json.loads(line)
    # arguments: {"gen_args_i": {"arg_0": context, "arg_1": continuation}}
    # in request order; resps: [[[loglikelihood, is_greedy]]] as strings.
    args = [s["arguments"][f"gen_args_{i}"] for i in range(len(s["arguments"]))]
    for a, resp in zip(args, s["resps"], strict=True):
        context, continuation = a["arg_0"], a["arg_1"]
        ll, greedy = resp[0]
        ctx, cont = encode_pair(context, continuation)
        requests.append({"doc_id": s["doc_id"], "context": context, "continuation": continuation,
                         "tokens": ctx + cont, "ctxlen": len(ctx),
                         "kvc": float(ll), "kvc_greedy": greedy in (True, "True")})
lines = "".join(json.dumps({"tokens": r["tokens"]}) + "\n" for r in requests)
scored = subprocess.run([scorer, "--seed", seed], input=lines, capture_output=True, text=True, check=True).stdout.splitlines()
worst, bad = 0.0, 0
with open(out_path, "w") as out:
    for r, line in zip(requests, scored, strict=True):
        ref = json.loads(line)
        k = r["ctxlen"] - 1  # entry i - 1 scores token i
        r["reference"] = sum(ref["logprobs"][k:])
        r["reference_greedy"] = all(ref["greedy"][k:])
        diff = abs(r["kvc"] - r["reference"])
        worst = max(worst, diff)
        ok = diff < 1e-3 and r["kvc_greedy"] == r["reference_greedy"]
        bad += not ok
        out.write(json.dumps({**r, "diff": diff, "ok": ok}) + "\n")
print(f"lm_eval_check: {len(requests)} loglikelihood requests, {len(requests) - bad} within 1e-3 of kvc-score "
      f"with the same is_greedy, largest difference {worst:.2e}")
sys.exit(1 if bad or not requests else 0)
PY
