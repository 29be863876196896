#!/usr/bin/env bash
# Issue 35 (2026-12-08): the batch-1 SiLU * up one-row kernels (FP8 gate|up
# at 4 chunks a lane) on a grid of resident blocks, each warp requesting
# its next task's weights before computing the current one (ONE_ROW_NEXT,
# kernels/gemv.cu), against main's grid of every task.
#   bash .gpu/run4.sh [full|short|tiny]
# full (~6 min): gpu_layers, gpu_fp8, the A/B at 1 and 8 x 2K in bf16 and
# fp8, the target table with this build, ncu of both gate|up kernels.
# short (~3 min): gpu_layers, gpu_fp8's batch-1 test, the A/B at 1 x 2K in
# fp8, then the rest of gpu_fp8 as time allows. tiny (~1 min): gpu_layers,
# one A/B pair at 1 x 2K in fp8, gpu_fp8's batch-1 test.
# .gpu/ holds kvc-bench (this build) and kvc-bench-main (883a8d8, run with
# KVC_FP8_DENSE_SWAP_ROWS=64 so that only the one-row kernels differ),
# test-gpu_layers and test-gpu_fp8 (this build). Carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
MODE=${1:-full}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture "${@:3}" 2>&1; echo "rc=$?"; }
show() { grep -h "^== \|test result\|FAILED\|panicked\|^rc=\|relative RMS" "$@"; }
T gpu_layers 90 > $OUT/tests_layers.log; show $OUT/tests_layers.log
if [ "$MODE" = tiny ]; then
  B="engine --shape qwen3-30b-a3b --device cuda --prefill 256 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048"
  for b in kvc-bench-main kvc-bench; do echo "== $b"; KVC_FP8_DENSE_SWAP_ROWS=64 timeout 60 bash $G/gpu_run.sh $b $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
  grep -E "^== kvc|^ graph" $OUT/ab.txt
  T gpu_fp8 60 batch_one > $OUT/tests_fp8_b1.log; show $OUT/tests_fp8_b1.log
  exit 0
fi
if [ "$MODE" = short ]; then
  T gpu_fp8 60 batch_one > $OUT/tests_fp8_b1.log; show $OUT/tests_fp8_b1.log
  B="engine --shape qwen3-30b-a3b --device cuda --prefill 256 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048"
else
  T gpu_fp8 150 > $OUT/tests_fp8.log; show $OUT/tests_fp8.log
  B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto --decode 1x2048,8x2048"
fi
for b in kvc-bench-main kvc-bench kvc-bench kvc-bench-main; do echo "== $b"; KVC_FP8_DENSE_SWAP_ROWS=64 timeout 100 bash $G/gpu_run.sh $b $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== kvc/{m=$2} /^=== weights/{w=$0} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print m, w, "batch", b, $3, $4}' $OUT/ab.txt
echo "elapsed $SECONDS s"
if [ "$MODE" = short ]; then T gpu_fp8 150 > $OUT/tests_fp8.log; show $OUT/tests_fp8.log; exit 0; fi
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
timeout 170 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table.txt 2>&1; echo "rc=$?" >> $OUT/table.txt
grep -A8 "weights compared" $OUT/table.txt; tail -1 $OUT/table.txt
echo "elapsed $SECONDS s"
[ $SECONDS -lt 330 ] || exit 0
A="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048"
for b in kvc-bench-main kvc-bench; do
  KVC_BENCH_PROFILE=graph-1 timeout 100 ncu --profile-from-start off -k regex:one_row_swiglu_fp8 -s 2 -c 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SpeedOfLight \
    bash $G/gpu_run.sh $b $A > $OUT/ncu_$b.txt 2>&1
  echo "== ncu $b"; grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|Grid Size|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Stall Long)" $OUT/ncu_$b.txt
done
echo "elapsed $SECONDS s"
