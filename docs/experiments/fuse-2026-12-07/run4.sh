#!/usr/bin/env bash
# Issue 35 (2026-12-07, night): three builds alternated, graphed decode at
# 1 and 8 x 2K, both weight dtypes over a bf16 pool: kvc-bench-head (46eb085:
# the fused kernels), kvc-bench-b1 (+ moe_sum_add_rmsnorm's pair rows all in
# flight), kvc-bench-b2 (+ the one-row kernels' minimum blocks an SM by
# chunks a lane: 8 at 2, 5 at 4). Then the GPU tests of b2 where carried,
# and on an H200 the target table of b1 and b2.
# Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto --decode 1x2048,8x2048"
for b in kvc-bench-head kvc-bench-b1 kvc-bench-b2 kvc-bench-b2 kvc-bench-b1 kvc-bench-head; do echo "== $b"; timeout 110 bash $G/gpu_run.sh $b $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== /{m=$2} /^=== weights/{w=$3} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print m, w, "batch", b, $3, $4}' $OUT/ab.txt
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
{ for t in gpu_layers gpu_fp8 gpu; do [ -f $G/test-$t.xz ] && T $t 170; done; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests.log
grep -q H200 $OUT/gpu.txt || exit 0
TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
for b in kvc-bench-b2 kvc-bench-b1; do
  timeout 150 bash $G/gpu_run.sh $b $TB > $OUT/table_$b.txt 2>&1; echo "rc=$?" >> $OUT/table_$b.txt
  echo "== $b"; grep -A6 "weights compared" $OUT/table_$b.txt
done
true
