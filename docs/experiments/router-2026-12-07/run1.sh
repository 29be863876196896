#!/usr/bin/env bash
# Issue 35 (2026-12-07 evening): where moe_router_route's ~12.9 us at batch 1
# go (ncu: warp stall reasons and per-SASS-line sampling of one launch in a
# graphed batch-1 step, fp8 weights). Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
A="engine --shape qwen3-30b-a3b --device cuda --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype auto --decode 1x2048"
KVC_BENCH_PROFILE=graph-1 timeout 200 ncu --profile-from-start off -k moe_router_route -s 2 -c 1 \
  --section LaunchStats --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis \
  --print-details all bash $G/gpu_run.sh kvc-bench $A > $OUT/ncu_router.txt 2>&1
echo "rc=$?" >> $OUT/ncu_router.txt
KVC_BENCH_PROFILE=graph-1 timeout 200 ncu --profile-from-start off -k moe_router_route -s 2 -c 1 --section SourceCounters \
  --page source --print-source sass --csv bash $G/gpu_run.sh kvc-bench $A > /tmp/src.csv 2>&1
gzip -c /tmp/src.csv > $OUT/ncu_router_sass.csv.gz
grep -i "duration\|stall\|warp cycles\|issued" $OUT/ncu_router.txt | head -40
