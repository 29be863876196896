#!/usr/bin/env bash
# Issue 35 (2026-12-07, late): where the batch-1 FP8 gate|up with SiLU
# (one_row_swiglu_fp8, ~17 us a layer for 25 MB) waits: ncu's warp stall
# reasons and per-SASS-line samples of one launch in a graphed batch-1
# step.
# Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
A="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048"
S="--section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis --print-details all"
KVC_BENCH_PROFILE=graph-1 timeout 150 ncu --profile-from-start off -k regex:one_row_swiglu_fp8 -s 2 -c 1 $S \
  bash $G/gpu_run.sh kvc-bench $A > $OUT/ncu_swiglu.txt 2>&1; echo "rc=$?" >> $OUT/ncu_swiglu.txt
KVC_BENCH_PROFILE=graph-1 timeout 150 ncu --profile-from-start off -k regex:one_row_swiglu_fp8 -s 2 -c 1 --section SourceCounters \
  --page source --print-source sass --csv bash $G/gpu_run.sh kvc-bench $A > /tmp/src.csv 2>&1
gzip -c /tmp/src.csv > $OUT/ncu_swiglu_sass.csv.gz
grep -i "duration\|stall\|warp cycles\|issued\|achieved occ\|throughput" $OUT/ncu_swiglu.txt | head -40
true
