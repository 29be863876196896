#!/usr/bin/env bash
# Issue 35: the batch-64 target on an H200 only (this build; batch 64 does not take the changed router kernel).
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
timeout 200 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_h200.txt 2>&1; echo "rc=$?" >> $OUT/table_h200.txt
grep -A14 "weights compared" $OUT/table_h200.txt; tail -2 $OUT/table_h200.txt
