#!/usr/bin/env bash
# Issue 35: the target table of the landed build (kvc-bench-b2) on an H200 only.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
timeout 200 bash .gpu/gpu_run.sh kvc-bench-b2 engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048 > $OUT/table_h200.txt 2>&1; echo "rc=$?" >> $OUT/table_h200.txt
grep -A6 "weights compared" $OUT/table_h200.txt; tail -1 $OUT/table_h200.txt
