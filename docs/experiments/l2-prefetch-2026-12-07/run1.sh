#!/usr/bin/env bash
# Issue 35, L2 prefetch of a decode step's weights (2026-12-07 evening).
# One binary, KVC_L2_PREFETCH_MB=0 (off, as main) against 32 (the default)
# and 48, alternated; then the GPU tests the change touches (gpu: the MoE
# graph paths; gpu_fp8). Copy into .gpu/ beside scripts/gpu_run.sh's staging;
# run with carry [".gpu"]: `bash .gpu/run1.sh`.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto --decode 1x2048,64x2048"
for mb in 0 32 48 0 32; do
  echo "== MB=$mb"; KVC_L2_PREFETCH_MB=$mb timeout 100 bash $G/gpu_run.sh kvc-bench $B 2>&1; echo "rc=$?"
done > $OUT/ab.txt
awk '/^== MB/{m=$2} /^=== weights/{w=$3} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print m, w, "batch", b, $0}' $OUT/ab.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
{ T gpu 150; T gpu_fp8 90; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests.log
true
