#!/usr/bin/env bash
# Issue 35 (2026-12-08): the target table with the swapped dense tiling on
# (KVC_FP8_DENSE_SWAP_ROWS=64, the default from this day), then run2.sh's
# ncu of the batch-1 FP8 gate|up. ~5 min.
# Copy run2.sh and this into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
KVC_FP8_DENSE_SWAP_ROWS=64 timeout 170 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table.txt 2>&1; echo "rc=$?" >> $OUT/table.txt
grep -A8 "weights compared" $OUT/table.txt; tail -1 $OUT/table.txt
echo "elapsed $SECONDS s"
bash $G/run2.sh
echo "elapsed $SECONDS s"
