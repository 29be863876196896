#!/usr/bin/env bash
# Issue 35, exp/fp8-next (2026-12-07): the dense FP8 GEMM's K split at decode
# (KVC_FP8_DENSE_SPLIT sweep at 64x2048 fp8/fp8-KV, graphs), then the target
# table with the fastest against main's build (f64399b), then the tests.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype fp8 --decode 64x2048"
best=0; bt=0
for s in 0 auto 4 8 autn sk; do
  KVC_FP8_DENSE_SPLIT=$s timeout 45 bash $G/gpu_run.sh kvc-bench $B > $OUT/sweep_$s.txt 2>&1; echo "rc=$?" >> $OUT/sweep_$s.txt
  t=$(awk '$1=="graph" && $2=="2048" {print $4}' $OUT/sweep_$s.txt); echo "split=$s graph tok/s=$t $(grep -o 'tokens [a-z]* [a-z]*' $OUT/sweep_$s.txt | head -1)" | tee -a $OUT/sweep.txt
  case $s in *n|sk) ;; *) if [ -n "$t" ] && [ "$t" -gt "$bt" ]; then bt=$t; best=$s; fi ;; esac
done
echo "best deterministic: $best ($bt tok/s)" | tee -a $OUT/sweep.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
KVC_FP8_DENSE_SPLIT=$best timeout 100 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_new.txt 2>&1; echo "rc=$?" >> $OUT/table_new.txt
timeout 100 bash $G/gpu_run.sh kvc-bench-old $TB > $OUT/table_old.txt 2>&1; echo "rc=$?" >> $OUT/table_old.txt
T() { timeout ${3:-90} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 > $OUT/test_$1$2.txt 2>&1; echo "rc=$?" >> $OUT/test_$1$2.txt; }
KVC_FP8_DENSE_SPLIT=$best KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm _best 40
KVC_FP8_DENSE_SPLIT=$best T gpu_fp8 _best 40
grep -h "test result\|FAILED\|panicked" $OUT/test_*.txt
for f in $OUT/table_*.txt; do echo "== $f"; grep -A7 "weights compared" $f; done
cat $OUT/sweep.txt
true
