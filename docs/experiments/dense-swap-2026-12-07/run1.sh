#!/usr/bin/env bash
# Issue 35 (2026-12-07, late): a decode step's dense FP8 projections (qkv,
# o_proj) on CUTLASS's swapped 64-row tiling (64 weight rows x 64 tokens a
# tile, ping-pong, 64-row weight scales) instead of 128x128 tiles.
# 1. fp8_gemm: both tilings at 1-128 rows against the reference, timed.
# 2. gpu_fp8 (the model over FP8 weights; one test with the swap on).
# 3. One binary, KVC_FP8_DENSE_SWAP_ROWS=0 (main's 128-row tiles) against
#    KVC_FP8_DENSE_SWAP_ROWS=64 (swap up to 64 rows), alternated, graphed decode.
# 4. On an H200 the target table with the swap on; 5. gpu, gpu_layers, as time allows.
# Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
KVC_FP8_TEST_ONLY=qkv,o_proj T fp8_gemm 90 > $OUT/fp8_gemm.log
grep -E "^(gemm|qkv|o_proj) " $OUT/fp8_gemm.log | awk '{print $1, $2, $5, $6, $7, $11}'; grep -h "test result\|FAILED\|panicked" $OUT/fp8_gemm.log
T gpu_fp8 150 > $OUT/tests_fp8.log; grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests_fp8.log
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto,fp8 --decode 8x2048,64x2048"
for s in 0 64 64 0; do echo "== swap $s"; KVC_FP8_DENSE_SWAP_ROWS=$s timeout 90 bash $G/gpu_run.sh kvc-bench $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== swap/{m=$3} /^=== weights/{w=$0} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print "swap", m, w, "batch", b, $3, $4}' $OUT/ab.txt
echo "elapsed $SECONDS s"
if grep -q H200 $OUT/gpu.txt; then
  TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
  KVC_FP8_DENSE_SWAP_ROWS=64 timeout 150 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table.txt 2>&1; echo "rc=$?" >> $OUT/table.txt
  grep -A6 "weights compared" $OUT/table.txt; tail -1 $OUT/table.txt
fi
echo "elapsed $SECONDS s"
if [ $SECONDS -lt 380 ]; then T gpu 150 > $OUT/tests_gpu.log; grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests_gpu.log; fi
if [ $SECONDS -lt 480 ]; then T gpu_layers 90 > $OUT/tests_layers.log; grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests_layers.log; fi
true
