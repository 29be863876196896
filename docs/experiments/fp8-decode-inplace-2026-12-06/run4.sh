#!/usr/bin/env bash
# Issue 35, exp/fp8-next 21670d6 (2026-12-07), last device minutes: bf16 and
# fp8/fp8-KV targets (same binary, same call), then the new kernels' tests.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --decode 1x2048,64x2048"
timeout 50 bash $G/gpu_run.sh kvc-bench $TB --dtype fp8 --kv-cache-dtype fp8 > $OUT/table_fp8.txt 2>&1; echo "rc=$?" >> $OUT/table_fp8.txt
timeout 50 bash $G/gpu_run.sh kvc-bench $TB --dtype bf16 --kv-cache-dtype auto > $OUT/table_bf16.txt 2>&1; echo "rc=$?" >> $OUT/table_bf16.txt
T() { timeout ${3:-90} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1$2.txt 2>&1; echo "rc=$?" >> $OUT/test_$1$2.txt; }
T gpu_attention "" 70
KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm "" 35
T gpu "" 80
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
true
