#!/usr/bin/env bash
# Issue 35 (2026-12-07 evening), same binary as run3.sh. 1. What the side
# stream's branches cost alone: KVC_L2_PREFETCH_MB=1 (a fork, a 1 MB prefetch
# and the join at every point) against 0 and 32, fp8 weights, alternated.
# 2. nsys timelines of the batch-1 graph replays with the prefetch off, fp8
# weights over a bf16 and over an fp8 pool. Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
B="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048,64x2048"
for mb in 0 1 32 0 1 32; do echo "== $mb"; KVC_L2_PREFETCH_MB=$mb timeout 60 bash $G/gpu_run.sh kvc-bench $B 2>&1; echo "rc=$?"; done > $OUT/branch.txt
awk '/^== /{m=$2} $1 ~ /^[0-9]+$/ && $2=="2048" {b=$1} $1=="graph" {print "MB", m, "batch", b, $3, $4}' $OUT/branch.txt
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "no nsys on this machine"; exit 0; }
for kv in auto fp8; do
  KVC_L2_PREFETCH_MB=0 timeout 120 $NSYS profile --cuda-graph-trace=node --trace=cuda -o /tmp/b1_$kv -f true bash $G/gpu_run.sh kvc-bench engine --shape qwen3-30b-a3b \
    --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype $kv --decode 1x2048 > /tmp/b1_$kv.log 2>&1
  $NSYS stats --report cuda_gpu_trace --format csv -o /tmp/b1_$kv /tmp/b1_$kv.nsys-rep > /dev/null 2>&1
  gzip -c /tmp/b1_${kv}_cuda_gpu_trace.csv > $OUT/b1_${kv}_trace.csv.gz 2>/dev/null
  grep "graph " /tmp/b1_$kv.log | head -2
done
true
