#!/usr/bin/env bash
# Issue 35, L2 prefetch on a side stream (2026-12-07 evening), one binary:
# KVC_L2_PREFETCH_MB=0 (off, as main) against variants: bulk or per-line
# prefetches (KVC_L2_PREFETCH_LINE), grid blocks (KVC_L2_PREFETCH_BLOCKS),
# the next layer's projections asked for after the feed-forward (default) or
# beside the router (KVC_L2_PREFETCH_DENSE_AT=router); then the GPU tests.
# Copy into .gpu/; run with carry [".gpu"]: `bash .gpu/run3.sh`.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto --decode 1x2048,64x2048"
run() { echo "== $1"; env $2 timeout 100 bash $G/gpu_run.sh kvc-bench $B 2>&1; echo "rc=$?"; }
{
run off KVC_L2_PREFETCH_MB=0
run bulk32 KVC_L2_PREFETCH_MB=32
run line32 "KVC_L2_PREFETCH_MB=32 KVC_L2_PREFETCH_LINE=1"
run router32 "KVC_L2_PREFETCH_MB=32 KVC_L2_PREFETCH_DENSE_AT=router"
run bulk64blk "KVC_L2_PREFETCH_MB=32 KVC_L2_PREFETCH_BLOCKS=64"
run off KVC_L2_PREFETCH_MB=0
run bulk32 KVC_L2_PREFETCH_MB=32
} > $OUT/ab.txt
awk '/^== /{m=$2} /^=== weights/{w=$3} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print m, w, "batch", b, $3, $4}' $OUT/ab.txt
grep -h "panicked\|Error\|error" $OUT/ab.txt | head -5
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
{ T gpu 150; T gpu_fp8 90; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=\|prefetch on vs off" $OUT/tests.log
true
