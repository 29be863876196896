#!/usr/bin/env bash
# Issue 35 (2026-12-07 evening). 1. On an H200 only: the target table with
# the L2 prefetch at its default and off (KVC_L2_PREFETCH_MB=0, main's
# behaviour). 2. Any GPU: nsys timelines of the batch-1 graph replays, fp8
# weights over a bf16 and over an fp8 pool (the fp8 pool's graphed loss lies
# between kernels; ncu: every kernel equal). Copy into .gpu/; run with carry
# [".gpu"]: `bash .gpu/run2.sh`.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
  for mb in 32 0; do
    KVC_L2_PREFETCH_MB=$mb timeout 150 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_h200_mb$mb.txt 2>&1; echo "rc=$?" >> $OUT/table_h200_mb$mb.txt
    echo "== MB=$mb"; grep -A12 "weights compared" $OUT/table_h200_mb$mb.txt
  done
fi
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "no nsys on this machine"; exit 0; }
for kv in auto fp8; do
  timeout 120 $NSYS profile --cuda-graph-trace=node --trace=cuda -o /tmp/b1_$kv -f true bash $G/gpu_run.sh kvc-bench engine --shape qwen3-30b-a3b \
    --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype $kv --decode 1x2048 > /tmp/b1_$kv.log 2>&1
  $NSYS stats --report cuda_gpu_trace --format csv -o /tmp/b1_$kv /tmp/b1_$kv.nsys-rep > /dev/null 2>&1
  gzip -c /tmp/b1_${kv}_cuda_gpu_trace.csv > $OUT/b1_${kv}_trace.csv.gz 2>/dev/null
  grep "graph " /tmp/b1_$kv.log | head -2
done
true
