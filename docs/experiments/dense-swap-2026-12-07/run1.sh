#!/usr/bin/env bash
# Issue 35 (2026-12-07, late): a decode step's dense FP8 projections (qkv,
# o_proj) on CUTLASS's swapped 64-row tiling (64 weight rows x 64 tokens a
# tile, ping-pong, 64-row weight scales) instead of 128x128 tiles.
#   bash .gpu/run1.sh [full|short|tiny]      (~9 / ~6 / ~4 min)
# 1. fp8_gemm: both tilings at 1-128 rows against the reference, timed.
# 2. gpu_fp8 (the model over FP8 weights; one test with the swap on; tiny:
#    that test alone).
# 3. One binary, KVC_FP8_DENSE_SWAP_ROWS=0 (main's 128-row tiles) against
#    KVC_FP8_DENSE_SWAP_ROWS=64, alternated, graphed decode: full 8 and 64 x
#    2K over a bf16 and an fp8 pool, off/on/on/off; short 64 x 2K over an
#    fp8 pool, off/on/on/off; tiny the same, one off/on pair.
# 4. full: on an H200 the target table with the swap on; gpu, gpu_layers
#    as time allows.
# Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
MODE=${1:-full}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture "${@:3}" 2>&1; echo "rc=$?"; }
show() { grep -h "^== \|test result\|FAILED\|panicked\|^rc=\|relative RMS" "$@"; }
KVC_FP8_TEST_ONLY=qkv,o_proj T fp8_gemm 90 > $OUT/fp8_gemm.log
grep -E "^(gemm|qkv|o_proj) " $OUT/fp8_gemm.log | awk '{print $1, $2, $5, $6, $7, $11}'; grep -h "test result\|FAILED\|panicked" $OUT/fp8_gemm.log
if [ "$MODE" = tiny ]; then T gpu_fp8 60 dense_tiling > $OUT/tests_fp8.log; else T gpu_fp8 150 > $OUT/tests_fp8.log; fi
show $OUT/tests_fp8.log
case $MODE in
  full) KV=auto,fp8 D=8x2048,64x2048 ORDER="0 64 64 0" ;;
  short) KV=fp8 D=64x2048 ORDER="0 64 64 0" ;;
  *) KV=fp8 D=64x2048 ORDER="0 64" ;;
esac
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype $KV --decode $D"
for s in $ORDER; do echo "== swap $s"; KVC_FP8_DENSE_SWAP_ROWS=$s timeout 90 bash $G/gpu_run.sh kvc-bench $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== swap/{m=$3} /^=== weights/{w=$0} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print "swap", m, w, "batch", b, $3, $4}' $OUT/ab.txt
echo "elapsed $SECONDS s"
[ "$MODE" = full ] || exit 0
if grep -q H200 $OUT/gpu.txt; then
  TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
  KVC_FP8_DENSE_SWAP_ROWS=64 timeout 150 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table.txt 2>&1; echo "rc=$?" >> $OUT/table.txt
  grep -A6 "weights compared" $OUT/table.txt; tail -1 $OUT/table.txt
fi
echo "elapsed $SECONDS s"
if [ $SECONDS -lt 380 ]; then T gpu 150 > $OUT/tests_gpu.log; show $OUT/tests_gpu.log; fi
if [ $SECONDS -lt 480 ]; then T gpu_layers 90 > $OUT/tests_layers.log; show $OUT/tests_layers.log; fi
true
