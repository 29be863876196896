#!/usr/bin/env bash
# Issue 35, branch exp/fp8-next (2026-12-06 night): FP8 decode attention reading e4m3
# tiles in place + the dense FP8 GEMM on stream-K at few tiles + (env) the grouped
# swap GEMM on the ping-pong schedule. Tests of the new build, old (main) vs new vs
# new+pingpong over both pools, the target table of the new build, then gpu.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { timeout ${3:-90} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1$2.txt 2>&1; echo "rc=$?" >> $OUT/test_$1$2.txt; }
T gpu_attention
KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm
KVC_FP8_SWAP_PINGPONG=1 KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm _pp
T gpu_fp8
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto,fp8 --decode 64x2048,32x8192,1x2048"
for r in old new newpp old2 new2 newpp2; do
  b=kvc-bench; case $r in old*) b=kvc-bench-old;; esac
  pp=0; case $r in newpp*) pp=1;; esac
  KVC_FP8_SWAP_PINGPONG=$pp timeout 45 bash $G/gpu_run.sh $b $B > $OUT/bench_$r.txt 2>&1; echo "rc=$?" >> $OUT/bench_$r.txt
done
timeout 80 bash $G/gpu_run.sh kvc-bench engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048 > $OUT/table_new.txt 2>&1; echo "rc=$?" >> $OUT/table_new.txt
T gpu "" 120
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
for f in $OUT/bench_*.txt $OUT/table_new.txt; do echo "== $f"; grep -A12 "weights compared" $f; done
true
