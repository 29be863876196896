#!/usr/bin/env bash
# Issue 35 (2026-12-07 afternoon): main's build (kvc-bench-old.xz of run1.sh:
# main with the bench's HBM roof from the device) on an H200 only: the target
# table twice in one call. On any other GPU it stops at once (that GPU's
# table is run1.sh's table_old.txt).
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: stopping"; exit 0; }
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
for i in a b; do timeout 150 bash $G/gpu_run.sh kvc-bench-old $TB > $OUT/table_main_$i.txt 2>&1; echo "rc=$?" >> $OUT/table_main_$i.txt; done
for f in $OUT/table_main_*.txt; do echo "== $f"; grep -A12 "weights compared" $f; done
true
