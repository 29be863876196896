#!/usr/bin/env bash
# Issue 35 (2026-12-07, late): the shortest check of the swap (~4 min):
# its kernels against the reference and timed at 1-128 rows, the model's
# FP8 test on the swap, then one off/on pair at 64 x 2K if time is left.
# Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture "${@:3}" 2>&1; echo "rc=$?"; }
KVC_FP8_TEST_ONLY=qkv,o_proj T fp8_gemm 70 > $OUT/fp8_gemm.log
grep -E "^(gemm|qkv|o_proj) " $OUT/fp8_gemm.log | awk '{print $1, $2, $5, $6, $7, $11}'; grep -h "test result\|FAILED\|panicked" $OUT/fp8_gemm.log
T gpu_fp8 60 swapped_dense > $OUT/tests_fp8.log; grep -h "^== \|test result\|FAILED\|panicked\|^rc=\|relative RMS" $OUT/tests_fp8.log
echo "elapsed $SECONDS s"
if [ $SECONDS -lt 120 ]; then
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype fp8 --decode 64x2048"
for s in 0 64; do echo "== swap $s"; KVC_FP8_DENSE_SWAP_ROWS=$s timeout 55 bash $G/gpu_run.sh kvc-bench $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== swap/{m=$3} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print "swap", m, "batch", b, $3, $4}' $OUT/ab.txt
fi
echo "elapsed $SECONDS s"
true
