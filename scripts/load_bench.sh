#!/usr/bin/env bash
# Serving under load on the GPU (issue 17): the prefill capacity by
# kvc-bench on the trace's own prompts, then the public Mooncake-shaped
# trace replayed by kvc-replay at real-time pacing at fractions of that
# capacity, one kvc-server for all (different prompt tokens per run, so no
# run hits another's cache).
# Run on the device after `scripts/cuda_setup.sh` and staging here:
#
#   cp /work/shared/traces/mooncake_synthetic_trace.jsonl .gpu/ && gzip -kf ...
#   scripts/load_bench.sh OUT "0.7 2.0" [kvc-server flags ...]
#
# env: N (requests from the trace's start, default 300),
# REQUEST_TIMEOUT_S (kvc-replay's per-request limit, default 600), CHUNK
# (the capacity's chunk, default 8192: pass the same --max-num-batched-tokens
# to the server), CAP_FROM=16k (capacity of one 16K prompt instead), SBL=1 to also
# time a short prompt behind a long one (scripts/short_behind_long.py),
# PACK=1 to leave only OUT.tgz (the device returns few files), AFTER=cmd
# to run cmd against the same server after the runs (below).
# OUT gets trace.txt, prefill-mix.txt, capacity.txt, for each fraction F run-F.tgz (kvc-replay's directory),
# metrics-F-{before,after}.txt and report-F.json / .md (scripts/load_report.py).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1 FRACS=$2
shift 2
N=${N:-300}
RUN=$ROOT/scripts/gpu_run.sh
TRACE=$ROOT/.gpu/mooncake_synthetic_trace.jsonl
[ -f "$TRACE" ] || gunzip -kf "$TRACE.gz"
[ -f "$ROOT/.gpu/qwen3-30b-a3b/tokenizer.json" ] || gunzip -kf "$ROOT/.gpu/qwen3-30b-a3b/tokenizer.json.gz"
mkdir -p "$OUT"

# 1. The trace's offered uncached prompt tokens/s at real time, and its
#    prefills ("cached new" per request) for the capacity.
"$RUN" kvc-replay inspect --trace "$TRACE" --max-sessions "$N" --prefill-mix "$OUT/prefill-mix.txt" | tee "$OUT/trace.txt"
OFFERED=$(python3 - "$OUT/trace.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
tok = float(re.search(r"(\d+) prompt tokens", t).group(1))
last = float(re.search(r"last arrival ([0-9.]+) s", t).group(1))
reuse = float(re.search(r"reusable ratio ([0-9.]+)", t).group(1))
print(tok * (1 - reuse) / last)
PY
)
echo "offered at real time: $OFFERED uncached prompt tok/s"

# 2. Capacity: kvc-bench's prefill tok/s on the trace's own prompts (each
#    request's uncached tokens at the depth they start, CHUNK-token chunks
#    as --max-num-batched-tokens cuts them; long prompts' quadratic
#    attention priced as paid), and one 16K prompt for comparison;
#    CAP_FROM=16k uses the latter, CAP=<tok/s> an earlier measurement.
if [ -n "${CAP:-}" ]; then echo "capacity (given): $CAP" > "$OUT/capacity.txt"; else
"$RUN" kvc-bench engine --shape qwen3-30b-a3b --device cuda --prefill 16384 --decode 1x2048 --steps 2 \
    --prefill-mix "$OUT/prefill-mix.txt" --chunk "${CHUNK:-8192}" | tee "$OUT/capacity.txt"
if [ "${CAP_FROM:-trace}" = 16k ]; then
    CAP=$(awk '$1 == 16384 && NF >= 3 {print $3}' "$OUT/capacity.txt" | tail -1)
else
    CAP=$(awk '/^workload prefill capacity:/ {print $4}' "$OUT/capacity.txt" | tail -1)
fi
fi
echo "capacity: $CAP prompt tok/s"

# 3. One server.
PORT=18200
RUST_LOG=${RUST_LOG:-info,kvc_engine::engine_loop::step=debug} "$RUN" kvc-server --model "$ROOT/.gpu/qwen3-30b-a3b" --load-format dummy --device cuda --port "$PORT" \
    --host 127.0.0.1 --max-model-len 131072 --gpu-memory-utilization 0.85 "$@" > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $SERVER 2>/dev/null || break
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || { tail -20 "$OUT/server.log"; exit 1; }

if [ "${SBL:-0}" = 1 ]; then
    python3 "$ROOT/scripts/short_behind_long.py" --url "http://127.0.0.1:$PORT" --long 32768 --short 1000 --repeat 3 \
        | tee "$OUT/short_behind_long.txt"
fi

seed=1
for F in $FRACS; do
    TS=$(python3 -c "print($F * $CAP / $OFFERED)")
    echo "== $F of capacity: time scale $TS"
    curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics-$F-before.txt"
    "$RUN" kvc-replay run --trace "$TRACE" --max-sessions "$N" --time-scale "$TS" --seed "$seed" \
        --url "http://127.0.0.1:$PORT" --concurrency 4096 --request-timeout-s "${REQUEST_TIMEOUT_S:-600}" \
        --no-progress --out "$OUT/run-$F" > "$OUT/replay-$F.log" 2>&1 || true
    curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics-$F-after.txt"
    python3 "$ROOT/scripts/load_report.py" --run "$OUT/run-$F" --metrics "$OUT/metrics-$F-after.txt" \
        --metrics-before "$OUT/metrics-$F-before.txt" --capacity "$CAP" --offered "$(python3 -c "print($F * $CAP)")" \
        --label "$F" | tee "$OUT/report-$F.txt"
    # Few files come back from the device: pack the run.
    tar czf "$OUT/run-$F.tgz" -C "$OUT" "run-$F" && rm -rf "$OUT/run-$F"
    seed=$((seed + 1))
done
# AFTER: a command run against the same server once the runs are done
# (its URL in $URL), output in OUT/after.txt.
if [ -n "${AFTER:-}" ]; then
    URL="http://127.0.0.1:$PORT" bash -c "$AFTER" 2>&1 | tee "$OUT/after.txt" || true
fi
python3 "$ROOT/scripts/step_log_stats.py" "$OUT/server.log" | tee "$OUT/steps.txt"
# Few files come back from the device: everything in one archive.
if [ "${PACK:-0}" = 1 ]; then
    tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && rm -rf "$OUT"
fi
