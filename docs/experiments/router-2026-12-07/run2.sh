#!/usr/bin/env bash
# Issue 35 (2026-12-07 evening): moe_router_route with the router row's
# loads all in flight before the math (kvc-bench) against main's
# (kvc-bench-old: main + KVC_GRAPH_DOT), alternated, graphed decode at 1 and
# 8 x 2K, both dtypes; ncu of the new router kernel; the GPU tests the
# routing touches. Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto --decode 1x2048,8x2048"
for b in kvc-bench-old kvc-bench kvc-bench-old kvc-bench; do echo "== $b"; timeout 90 bash $G/gpu_run.sh $b $B 2>&1; echo "rc=$?"; done > $OUT/ab.txt
awk '/^== /{m=$2} /^=== weights/{w=$3} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print m, w, "batch", b, $3, $4}' $OUT/ab.txt
A="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048"
for b in kvc-bench-old kvc-bench; do
  KVC_BENCH_PROFILE=graph-1 timeout 100 ncu --profile-from-start off -k moe_router_route -s 2 -c 5 --metrics gpu__time_duration.sum \
    bash $G/gpu_run.sh $b $A > $OUT/ncu_$b.txt 2>&1; echo "== $b"; grep "gpu__time_duration" $OUT/ncu_$b.txt
done
T() { echo "== $1"; timeout ${2:-120} bash $G/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture 2>&1; echo "rc=$?"; }
{ T gpu 150; T gpu_layers 90; } > $OUT/tests.log
grep -h "^== \|test result\|FAILED\|panicked\|^rc=" $OUT/tests.log
true
