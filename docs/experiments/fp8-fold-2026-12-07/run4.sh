#!/usr/bin/env bash
# Issue 35, for the next device call (not run yet): main's build (kvc-bench.xz
# from scripts/cuda_setup.sh, or kvc-bench-old.xz as run1.sh staged it).
# 1. On an H200 only: the target table (the batch-64 target is set on an H200).
# 2. Any GPU: an nsys timeline of the batch-1 graph replays, fp8 weights over a
#    bf16 and over an fp8 pool, to find the ~150 us a step the fp8 pool loses
#    between kernels (ncu: every kernel equal; docs/benchmarks.md).
cd "$(dirname "$0")/.."
G=.gpu
B=kvc-bench; [ -f $G/kvc-bench.xz ] || [ -f $G/kvc-bench.gz ] || B=kvc-bench-old
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
  timeout 150 bash $G/gpu_run.sh $B $TB > $OUT/table_h200.txt 2>&1; echo "rc=$?" >> $OUT/table_h200.txt
  grep -A12 "weights compared" $OUT/table_h200.txt
fi
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "no nsys on this machine"; exit 0; }
for kv in auto fp8; do
  timeout 120 $NSYS profile --cuda-graph-trace=node --trace=cuda -o /tmp/b1_$kv -f true bash $G/gpu_run.sh $B engine --shape qwen3-30b-a3b \
    --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype $kv --decode 1x2048 > /tmp/b1_$kv.log 2>&1
  $NSYS stats --report cuda_gpu_trace --format csv -o /tmp/b1_$kv /tmp/b1_$kv.nsys-rep > /dev/null 2>&1
  gzip -c /tmp/b1_${kv}_cuda_gpu_trace.csv > $OUT/b1_${kv}_trace.csv.gz 2>/dev/null
  grep "graph " /tmp/b1_$kv.log | head -2
done
true
