#!/usr/bin/env bash
# The KV pool kvc-server allocates at --gpu-memory-utilization 0.85 for each
# --kv-cache-dtype, and one completion through each (docs/benchmarks.md,
# "FP8 KV cache on the GPU"). On the device, after scripts/cuda_setup.sh,
# scripts/make_model_dir.sh .gpu/qwen3-30b-a3b and
# scripts/mooncake_cuda_stage.sh here:
#
#   scripts/kv_capacity.sh OUT [auto fp8]
#
# Prints each run's "allocate kv pool" and "model loaded" log lines and the
# completion's first bytes; OUT gets the server logs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1
shift
DTYPES=${*:-auto fp8}
M=$ROOT/.gpu/qwen3-30b-a3b
[ -f "$M/tokenizer.json" ] || gunzip -kf "$M/tokenizer.json.gz"
mkdir -p "$OUT"
port=8200
for kv in $DTYPES; do
    port=$((port + 1))
    log=$OUT/server-$kv.log
    url=http://127.0.0.1:$port
    setsid bash "$ROOT/scripts/gpu_run.sh" kvc-server --device cuda --model "$M" --load-format dummy --port $port \
        --host 127.0.0.1 --max-model-len 131072 --gpu-memory-utilization 0.85 --kv-cache-dtype "$kv" > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        curl -sf "$url/health" > /dev/null && break
        kill -0 $pid 2> /dev/null || break
        sleep 0.5
    done
    echo "== --kv-cache-dtype $kv"
    grep -E "allocate kv pool|model loaded" "$log" | sed 's/\x1b\[[0-9;]*m//g' || true
    model=$(curl -s "$url/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])' || true)
    curl -s "$url/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\": \"$model\", \"prompt\": \"The KV cache holds\", \"max_tokens\": 16}" | head -c 300 || true
    echo
    kill -- -$pid 2> /dev/null || true
    wait $pid 2> /dev/null || true
done
