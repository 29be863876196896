#!/usr/bin/env bash
# Issue 29's experiment: agentic sessions whose KV outgrows one GPU's pool,
# replayed at real time against three configurations of one kvc-server
# (docs/experiments/pressure-one-gpu.md):
#
#   a  prefix cache only        --no-enable-session-cache --swap-space 0
#   b  session cache, no host   --swap-space 0
#   c  session cache + host     --swap-space $SWAP
#
# On the device, after scripts/cuda_setup.sh and staging here (kvc-replay
# is a CPU binary: gzip it into .gpu/ beside the GPU ones):
#
#   scripts/pressure_one_gpu.sh OUT "a c" [kvc-server flags ...]
#
# env: SESSIONS (8), TURNS (20, --max-turns), WINDOW (10 s, arrival window),
# SEED (11), DURATION (400 s of replay a run), POOL (7500 blocks: what an
# 80 GB H100 keeps beside Qwen3-30B-A3B's weights), BATCH (8192,
# --max-num-batched-tokens), SWAP (32 GiB), TAG (appended to run names).
# OUT gets, per configuration X, X$TAG.tgz: kvc-replay's directory (rows as
# they finished, /metrics every 2 s, summary), the server's log and its
# /metrics at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1 CONFIGS=$2
shift 2
SESSIONS=${SESSIONS:-8} TURNS=${TURNS:-20} WINDOW=${WINDOW:-10} SEED=${SEED:-11}
DURATION=${DURATION:-400} POOL=${POOL:-7500} BATCH=${BATCH:-8192} SWAP=${SWAP:-32} TAG=${TAG:-}
RUN=$ROOT/scripts/gpu_run.sh
MODEL=$ROOT/.gpu/qwen3-30b-a3b
[ -f "$MODEL/tokenizer.json" ] || gunzip -kf "$MODEL/tokenizer.json.gz"
mkdir -p "$OUT"
port=8100
for cfg in $CONFIGS; do
    case $cfg in
        a) flags=(--no-enable-session-cache --swap-space 0) ;;
        b) flags=(--swap-space 0) ;;
        c) flags=(--swap-space "$SWAP") ;;
        *) echo "unknown configuration $cfg (a, b, c)" >&2; exit 2 ;;
    esac
    name=$cfg$TAG
    dir=$OUT/$name
    mkdir -p "$dir"
    port=$((port + 1))
    "$RUN" kvc-server --device cuda --model "$MODEL" --load-format dummy --port $port --host 127.0.0.1 \
        --num-kv-blocks "$POOL" --max-num-batched-tokens "$BATCH" "${flags[@]}" "$@" > "$dir/server.log" 2>&1 &
    server=$!
    url=http://127.0.0.1:$port
    for _ in $(seq 600); do
        curl -sf "$url/health" > /dev/null && break
        kill -0 $server 2> /dev/null || { echo "server $name exited" >&2; tail -20 "$dir/server.log" >&2; exit 1; }
        sleep 0.5
    done
    echo "== $name: server up after $SECONDS s; flags: ${flags[*]} $*"
    "$RUN" kvc-replay run --url "$url" --synth agentic --sessions "$SESSIONS" --max-turns "$TURNS" \
        --arrival-window-s "$WINDOW" --seed "$SEED" --duration-s "$DURATION" --scrape-interval-s 2 \
        --out "$dir/replay" --no-progress 2>&1 | tail -40 || true
    curl -s "$url/metrics" > "$dir/metrics-end.txt" || true
    curl -s "$url/health" > "$dir/health-end.json" || true
    kill $server; wait $server || true
    grep -c 'event="engine_stalled"' "$dir/server.log" || true
    grep -E '^kvc_(engine_stalled_steps_total|evicted_blocks_total|host_restores_total|preemptions_total|session_hits_total|prompt_tokens_(computed|reused)_total|scheduler_head_of_line_passed_total|engine_steps_total)' \
        "$dir/metrics-end.txt" | grep -v ' 0$' || true
    gzip -9 -f "$dir/server.log"
    tar czf "$OUT/$name.tgz" -C "$OUT" "$name"
    rm -rf "$dir"
done
