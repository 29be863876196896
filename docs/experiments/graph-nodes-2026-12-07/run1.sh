#!/usr/bin/env bash
# Issue 35 (2026-12-07 evening), main's build plus KVC_GRAPH_DOT (the
# captured decode graph dumped as Graphviz). 1. Any GPU: the batch-1 graph
# of fp8 weights over a bf16 and over an fp8 pool, dumped and timed (the fp8
# pool's graphed step is 4-5 % slower while ncu finds every kernel equal).
# 2. On an H200 only: main's target table. Copy into .gpu/; carry [".gpu"].
cd "$(dirname "$0")/.."
G=.gpu
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader | tee $OUT/gpu.txt
for kv in auto fp8 auto fp8; do
  mkdir -p /tmp/dot_$kv; rm -f /tmp/dot_$kv/*
  echo "== $kv"; KVC_GRAPH_DOT=/tmp/dot_$kv timeout 60 bash $G/gpu_run.sh kvc-bench engine --shape qwen3-30b-a3b --device cuda \
    --prefill 1024 --cuda-graph --dtype fp8 --kv-cache-dtype $kv --decode 1x2048 2>&1 | grep -A1 "^     1 "
done | tee $OUT/b1.txt
for kv in auto fp8; do ls -la /tmp/dot_$kv; for f in /tmp/dot_$kv/*.dot; do gzip -c $f > $OUT/${kv}_$(basename $f).gz; done; done
if grep -q H200 $OUT/gpu.txt; then
  TB="engine --shape qwen3-30b-a3b --device cuda --prefill 8192 --cuda-graph --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --decode 1x2048,64x2048"
  timeout 200 bash $G/gpu_run.sh kvc-bench $TB > $OUT/table_h200.txt 2>&1; echo "rc=$?" >> $OUT/table_h200.txt
  grep -A14 "weights compared" $OUT/table_h200.txt
fi
true
