#!/usr/bin/env bash
# Issue 35: where a graphed decode step at batch 64 x 2K goes on the lent card (f64399b build), bf16 vs fp8 weights, bf16 vs fp8 pool.
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/gpu.txt
KVC_BENCH_PROFILE=graph-64 timeout 560 ncu --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base --page raw \
  --cache-control none --clock-control none bash $G/gpu_run.sh kvc-bench-old engine --shape qwen3-30b-a3b --device cuda --prefill 1024 \
  --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 64x2048 > $OUT/ncu64.txt 2>&1; echo "rc=$?" >> $OUT/ncu64.txt
python3 scripts/ncu_ranges.py $OUT/ncu64.txt --top 30 > $OUT/ncu64_table.txt 2>&1
gzip -9 $OUT/ncu64.txt
cat $OUT/ncu64_table.txt | head -150
true
