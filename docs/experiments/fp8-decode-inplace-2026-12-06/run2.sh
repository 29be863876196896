#!/usr/bin/env bash
# Issue 35, branch exp/fp8-next 21670d6 (2026-12-07): the target table of the new
# build (in-place FP8 decode attention, stream-K dense FP8, redux top-k) against
# main's (f64399b) in the same call, then the tests, then ping-pong A/B.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
timeout 100 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_new.txt 2>&1; echo "rc=$?" >> $OUT/table_new.txt
timeout 100 bash $G/gpu_run.sh kvc-bench-old $TB > $OUT/table_old.txt 2>&1; echo "rc=$?" >> $OUT/table_old.txt
T() { timeout ${3:-90} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1$2.txt 2>&1; echo "rc=$?" >> $OUT/test_$1$2.txt; }
T gpu_attention
KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm "" 60
KVC_FP8_SWAP_PINGPONG=1 KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm _pp 60
T gpu "" 100
T gpu_fp8 "" 60
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype fp8 --decode 64x2048,32x8192"
for pp in 0 1; do KVC_FP8_SWAP_PINGPONG=$pp timeout 45 bash $G/gpu_run.sh kvc-bench $B > $OUT/bench_pp$pp.txt 2>&1; echo "rc=$?" >> $OUT/bench_pp$pp.txt; done
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
for f in $OUT/table_*.txt $OUT/bench_*.txt; do echo "== $f"; grep -A12 "weights compared" $f; grep "^ *64 \|^ *32 " $f; done
true
