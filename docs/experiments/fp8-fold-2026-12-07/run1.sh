#!/usr/bin/env bash
# Issue 35, main + moe_topk_align (2026-12-07 afternoon): the target table of
# the new build against the last commit's (kvc-bench-old: the same code with
# moe_topk then moe_align) in one call, new again (run-to-run), then every GPU
# test the new build changes (gpu: the routing at production
# widths; gpu_fp8; fp8_gemm). Copy into .gpu/ beside scripts/gpu_run.sh's staging;
# run with carry [".gpu"]: `bash .gpu/run1.sh`. Five files come back.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
timeout 110 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_new.txt 2>&1; echo "rc=$?" >> $OUT/table_new.txt
timeout 110 bash $G/gpu_run.sh kvc-bench-old $TB > $OUT/table_old.txt 2>&1; echo "rc=$?" >> $OUT/table_old.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype fp8 --decode 64x2048"
for b in kvc-bench kvc-bench-old kvc-bench kvc-bench-old; do echo "== $b"; timeout 45 bash $G/gpu_run.sh $b $B 2>&1; echo "rc=$?"; done > $OUT/ab64.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
{ T gpu 150; T gpu_fp8 90; KVC_FP8_TEST_LM_HEAD=0 T fp8_gemm 60; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests.log
for f in $OUT/table_*.txt; do echo "== $f"; grep -A12 "weights compared" $f; done
awk '/^== /{b=$2} $1=="graph" && $2=="2048" {print b, $0}' $OUT/ab64.txt
true
