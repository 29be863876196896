#!/usr/bin/env bash
# Last device minutes: correctness of both kernels, then new vs old (vs pingpong).
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { timeout ${3:-50} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1$2.txt 2>&1; echo "rc=$?" >> $OUT/test_$1$2.txt; }
T gpu_attention
KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto,fp8 --decode 64x2048,32x8192"
for r in new old newpp; do
  b=kvc-bench; case $r in old*) b=kvc-bench-old;; esac
  pp=0; case $r in newpp*) pp=1;; esac
  KVC_FP8_SWAP_PINGPONG=$pp timeout 35 bash $G/gpu_run.sh $b $B > $OUT/bench_$r.txt 2>&1; echo "rc=$?" >> $OUT/bench_$r.txt
  grep -A8 "weights compared" $OUT/bench_$r.txt
done
KVC_FP8_SWAP_PINGPONG=1 KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm _pp
true
