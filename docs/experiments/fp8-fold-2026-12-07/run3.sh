#!/usr/bin/env bash
# Issue 35 (2026-12-07 afternoon), main's build (kvc-bench-old.xz of run1.sh):
# on an H200 first the target table; on any GPU then ncu of one graphed
# batch-1 decode step (2K context) with fp8 weights over a bf16 and over an
# fp8 pool: the fp8 pool is 4-5 % slower at batch 1 with fp8 weights only
# (bf16 weights: not), and eager steps hide it.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
  timeout 150 bash $G/gpu_run.sh kvc-bench-old $TB > $OUT/table_main_h200.txt 2>&1; echo "rc=$?" >> $OUT/table_main_h200.txt
  grep -A12 "weights compared" $OUT/table_main_h200.txt
fi
for kv in auto fp8; do
  KVC_BENCH_PROFILE=graph-1 timeout 150 ncu --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base --page raw \
    --cache-control none --clock-control none bash $G/gpu_run.sh kvc-bench-old engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph \
    --dtype fp8 --kv-cache-dtype $kv --decode 1x2048 > /tmp/ncu_$kv.txt 2>&1; echo "rc=$?" >> /tmp/ncu_$kv.txt
  gzip -c /tmp/ncu_$kv.txt > $OUT/ncu_b1_fp8_kv$kv.txt.gz
  grep "graph " /tmp/ncu_$kv.txt | head -2; tail -2 /tmp/ncu_$kv.txt
done
true
