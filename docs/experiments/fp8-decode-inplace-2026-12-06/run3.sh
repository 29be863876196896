#!/usr/bin/env bash
# Issue 35, exp/fp8-next 21670d6 (2026-12-07), little device time: the new build's
# target table, its kernels' tests, then main's (f64399b) table, then gpu_fp8.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
T() { timeout ${3:-90} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1$2.txt 2>&1; echo "rc=$?" >> $OUT/test_$1$2.txt; }
timeout 100 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_new.txt 2>&1; echo "rc=$?" >> $OUT/table_new.txt
T gpu_attention "" 80
KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm "" 40
T gpu "" 80
timeout 100 bash $G/gpu_run.sh kvc-bench-old $TB > $OUT/table_old.txt 2>&1; echo "rc=$?" >> $OUT/table_old.txt
T gpu_fp8 "" 40
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
true
