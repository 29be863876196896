#!/usr/bin/env bash
# Issue 35, branch exp/fp8-next: FP8 decode attention reading e4m3 tiles in place and
# the dense FP8 GEMM on stream-K at few tiles. gpu_attention and fp8_gemm of the new
# build, then old (main) vs new over both pools, then gpu.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { timeout 90 bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1.txt 2>&1; echo "rc=$?" >> $OUT/test_$1.txt; }
T gpu_attention
KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto,fp8 --decode 64x2048,32x8192,1x2048"
for r in old new old2 new2; do
  b=kvc-bench; case $r in old*) b=kvc-bench-old;; esac
  timeout 40 bash $G/gpu_run.sh $b $B > $OUT/bench_$r.txt 2>&1; echo "rc=$?" >> $OUT/bench_$r.txt
done
T gpu
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
for f in $OUT/bench_*.txt; do echo "== $f"; grep -A8 "weights compared" $f; done
true
