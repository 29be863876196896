#!/bin/bash
# One device call, most needed first: the attention test, the shape benchmark with the FP8 route
# at every size and off, then the other GPU tests.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
t() { /usr/bin/time -f "wall %e s" timeout 150 bash .gpu/gpu_run.sh /tmp/kvc-gpu-bin/test-$1 --ignored --test-threads 1 --nocapture > $OUT/test_$1.txt 2>&1; echo "test $1 rc=$?" >> $OUT/summary.txt; }
B="kvc-bench engine --shape qwen3-30b-a3b --device cuda"
t gpu_attention
/usr/bin/time -f "wall %e s" timeout 200 env KVC_FP8_ATTENTION_MIN_TOKENS=0 bash .gpu/gpu_run.sh $B --dtype bf16,fp8 --kv-cache-dtype auto,fp8 --prefill 1024,2048,4096,8192 --decode 1x2048,64x2048 --cuda-graph > $OUT/bench_min0.txt 2>&1
echo "bench_min0 rc=$?" >> $OUT/summary.txt
/usr/bin/time -f "wall %e s" timeout 120 env KVC_FP8_ATTENTION=0 bash .gpu/gpu_run.sh $B --dtype fp8 --kv-cache-dtype fp8 --prefill 1024,2048,4096,8192 > $OUT/bench_off.txt 2>&1
echo "bench_off rc=$?" >> $OUT/summary.txt
for x in gpu_fp8 gpu_layers gpu fp8_gemm; do t $x; done
cat $OUT/summary.txt
