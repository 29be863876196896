#!/usr/bin/env bash
# Issue 35 (2026-12-07, night): main's build (kvc-bench-old) against the
# fused kernels (kvc-bench), alternated, graphed decode at 1 and 8 x 2K,
# both weight dtypes over a bf16 pool. Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto --decode 1x2048,8x2048"
for b in kvc-bench-old kvc-bench kvc-bench kvc-bench-old; do echo "== $b"; timeout 110 bash $G/gpu_run.sh $b $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== /{m=$2} /^=== weights/{w=$3} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print m, w, "batch", b, $3, $4}' $OUT/ab.txt
true
