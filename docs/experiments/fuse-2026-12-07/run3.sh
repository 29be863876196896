#!/usr/bin/env bash
# Issue 35 (2026-12-07, night): ncu of one graphed batch-1 step, fp8 and
# bf16 weights, this build (kvc-bench): every kernel's time and DRAM bytes
# (tables: scripts/ncu_ranges.py). Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
for d in fp8 bf16; do
  KVC_BENCH_PROFILE=graph-1 timeout 200 ncu --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base --page raw --cache-control none --clock-control none \
    bash $G/gpu_run.sh kvc-bench engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype $d --kv-cache-dtype auto --decode 1x2048 > $OUT/ncu1_$d.csv 2>&1
  echo "$d rc=$? lines=$(wc -l < $OUT/ncu1_$d.csv)"
done
gzip -9 $OUT/*.csv
true
