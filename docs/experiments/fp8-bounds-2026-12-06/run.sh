#!/bin/bash
# Last device call of the session (little budget left): the default bounds end to end against the route off, gpu_fp8, gpu.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
B="kvc-bench engine --shape qwen3-30b-a3b --device cuda --dtype fp8 --kv-cache-dtype fp8 --prefill 1024,2048,4096,8192"
/usr/bin/time -f "wall %e s" timeout 40 bash .gpu/gpu_run.sh $B > $OUT/bench_default.txt 2>&1; echo "bench_default rc=$?" >> $OUT/summary.txt
/usr/bin/time -f "wall %e s" timeout 40 env KVC_FP8_ATTENTION=0 bash .gpu/gpu_run.sh $B > $OUT/bench_off.txt 2>&1; echo "bench_off rc=$?" >> $OUT/summary.txt
for x in gpu_fp8 gpu; do
  /usr/bin/time -f "wall %e s" timeout 60 bash .gpu/gpu_run.sh /tmp/kvc-gpu-bin/test-$x --ignored --test-threads 1 --nocapture > $OUT/test_$x.txt 2>&1
  echo "test $x rc=$?" >> $OUT/summary.txt
done
cat $OUT/summary.txt
