#!/usr/bin/env bash
# Mooncake's own transfer_engine_bench, GPU 0 -> GPU 1 of one host, for each
# transport given: the baseline kvc's KV transfers are compared with
# (issue 9). Runs on the GPU machine through scripts/gpu_run.sh, which puts
# the bench (staged by `scripts/mooncake_cuda_stage.sh --bench`) in
# $KVC_BIN as `mooncake-bench` and Mooncake's libraries on LD_LIBRARY_PATH:
#
#   bash scripts/gpu_run.sh bash scripts/mooncake_gpu_bench.sh tcp nvlink_intra
#
# Env: BLOCK (bytes per request, default 4 MiB), BATCH (requests per batch,
# 32), THREADS (4), DURATION (s, 5), MC_TCP_SLICE_SIZE (Mooncake's TCP chunk
# and staging-copy size; 4 MiB here unless set).
set -u -o pipefail
BIN=${KVC_BIN:-/tmp/kvc-gpu-bin}/mooncake-bench
BLOCK=${BLOCK:-4194304}
BATCH=${BATCH:-32}
THREADS=${THREADS:-4}
DURATION=${DURATION:-5}
export MC_TCP_SLICE_SIZE=${MC_TCP_SLICE_SIZE:-4194304}
LOG=${OUT:-/tmp}/mooncake-bench
mkdir -p "$LOG"
for proto in "${@:-tcp}"; do
    t="$LOG/target-$proto.log"
    "$BIN" --mode=target --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 \
        --protocol="$proto" --use_vram=true --gpu_id=1 >"$t" 2>&1 &
    tpid=$!
    port=""
    for _ in $(seq 1 100); do
        port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$t" | head -1)
        [ -n "$port" ] && break
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.2
    done
    if [ -z "$port" ]; then
        echo "mooncake bench $proto: the target did not start:"; tail -5 "$t"
        kill "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null
        continue
    fi
    i="$LOG/initiator-$proto.log"
    timeout $((DURATION + 60)) "$BIN" --mode=initiator --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 \
        --segment_id="127.0.0.1:$port" --protocol="$proto" --use_vram=true --gpu_id=0 --operation=write \
        --block_size="$BLOCK" --batch_size="$BATCH" --threads="$THREADS" --duration="$DURATION" >"$i" 2>&1
    rc=$?
    echo "mooncake bench $proto (GPU 0 -> GPU 1, write, block $BLOCK, batch $BATCH, threads $THREADS, ${DURATION}s): rc=$rc"
    grep -h "throughput\|FAILED\|rror" "$i" | tail -3
    kill "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null
done
