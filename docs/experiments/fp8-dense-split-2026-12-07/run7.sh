#!/usr/bin/env bash
# Issue 35, exp/fp8-next (2026-12-07), last device minutes: dense split 0 vs auto
# at 64x2048 fp8/fp8-KV, the split-K self-test, then bf16 vs fp8 at 64x2048 with auto.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype fp8 --decode 64x2048"
for s in 0 auto; do
  KVC_FP8_DENSE_SPLIT=$s timeout 40 bash $G/gpu_run.sh kvc-bench $B > $OUT/sweep_$s.txt 2>&1; echo "rc=$?" >> $OUT/sweep_$s.txt
  echo "split=$s $(grep '^ graph' $OUT/sweep_$s.txt)"
done
KVC_FP8_DENSE_SPLIT=auto KVC_FP8_TEST_LM_HEAD=0 timeout 30 bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-fp8_gemm --ignored --test-threads 1 > $OUT/test_fp8_gemm_auto.txt 2>&1; echo "rc=$?" >> $OUT/test_fp8_gemm_auto.txt
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 64x2048"
KVC_FP8_DENSE_SPLIT=auto timeout 80 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_auto.txt 2>&1; echo "rc=$?" >> $OUT/table_auto.txt
grep -A6 "weights compared" $OUT/table_auto.txt
true
