#!/usr/bin/env bash
# Issue 35 (2026-12-07, night): the GPU tests of the fused kernels
# (one_row_swiglu, moe_sum_add_rmsnorm) and of the paths they join, then
# the target table with this build (kvc-bench). Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
# Unpack the binaries first (gpu_run.sh does it on its first call).
bash $G/gpu_run.sh true
{ T gpu_layers 90; T gpu_fp8 150; T gpu 170; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests.log
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
timeout 200 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table.txt 2>&1; echo "rc=$?" >> $OUT/table.txt
grep -A16 "weights compared" $OUT/table.txt; tail -1 $OUT/table.txt
true
