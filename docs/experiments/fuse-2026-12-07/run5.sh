#!/usr/bin/env bash
# Issue 35: on an H200, the target table of the landed build
# (kvc-bench-b2); on any GPU, that build's gpu_fp8 and gpu tests.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  timeout 200 bash $G/gpu_run.sh kvc-bench-b2 engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048 > $OUT/table_h200.txt 2>&1; echo "rc=$?" >> $OUT/table_h200.txt
  grep -A6 "weights compared" $OUT/table_h200.txt; tail -1 $OUT/table_h200.txt
fi
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
{ T gpu_fp8 150; T gpu 170; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests.log
true
