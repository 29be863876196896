#!/usr/bin/env bash
# The headline experiment (issue 9): the same workloads on the same two
# devices, served three ways, replayed in real time with kvc-replay.
#
#   scripts/headline.sh OUT_DIR
#
# On the lent 2-GPU machine (no Rust, no network; binaries carried in .gpu/):
#
#   bash scripts/gpu_run.sh bash scripts/headline.sh "$OUT/res"
#
# gpu_run.sh gunzips .gpu/*.gz into /tmp/kvc-gpu-bin (the default KVC_BIN)
# and sets LD_LIBRARY_PATH for CUDA. The same script, with other env values,
# is the CPU dry run on the embedded tiny model (see "CPU dry run" below).
#
# ## The three configurations
#
# All three use the same two devices, DEV_A and DEV_B, one server process per
# device, and are started fresh (no state carried from another config).
#
#   dp     Data parallel: two `--role both` workers (one per device), each a
#          complete server with its prefix cache and session cache, behind a
#          `--role router` that places requests cache-aware (sessions stick to
#          the worker holding their KV). The client talks to the router.
#          This is what a colocated deployment (vLLM/SGLang DP + a
#          prefix-aware router) does.
#
#   naive  Classic 1P1D disaggregation, as vLLM/SGLang P/D serve it today:
#          `--role prefill` on DEV_A, `--role decode` on DEV_B. The decode
#          worker keeps no session KV and no prefix cache, and sends EVERY
#          turn, whatever its length, to the prefill worker, which computes
#          the prompt and ships the KV to decode:
#            decode:  --no-enable-session-cache --no-enable-prefix-caching
#                     --remote-prefill-policy threshold
#                     --remote-prefill-min-tokens 1 --snapshot-min-tokens 0
#            prefill: --no-enable-session-cache --snapshot-store-blocks 0
#          The prefill worker keeps its prefix cache (as a vLLM/SGLang prefill
#          worker does), so a turn's earlier prompt is usually a prefix hit
#          there, but its whole KV still crosses to decode every turn.
#          The client talks to the decode worker.
#
#   kvc    kvc's 1P1D with its defaults: prefill on DEV_A, decode on DEV_B.
#          Decode keeps each session's KV between turns (session cache), so a
#          later turn only computes its new suffix: locally when short
#          (direct append), on the prefill worker when the cost model says so;
#          decode pushes session snapshots to the prefill worker, which can
#          then prefill a long suffix on top of them; first turns go remote.
#          The client talks to the decode worker.
#
# ## Workloads (each config serves both, back to back, on the same servers)
#
#   agentic   kvc-replay --synth agentic: SWE-bench-shaped multi-turn agent
#             sessions (session ids sent; prompts grow to ~100K tokens).
#   mooncake  the Mooncake (FAST'25) trace: independent requests, reuse only
#             through shared prefixes (hash ids), no sessions.
#
# Every pair is replayed in real time (--time-scale 1) --runs $RUNS times.
# No reset between the two workloads: their tokens differ, so trace 1's
# cached state cannot help trace 2.
#
# ## Output (OUT_DIR)
#
#   <trace>-<config>/        kvc-replay results (summary.md, metrics.jsonl, ...)
#   compare-<trace>.md       kvc-replay compare of the configs that ran
#   paths-<trace>.md         path mix (remote_prefill, direct_append, local...)
#                            per config and run, from each summary.md
#   status.txt               per pair: replay exit status, wall time, note
#   headline.log             this script's log (also on stdout)
#   setup.txt                every setting, binary versions
#   logs/<config>-<role>.log server logs; logs/<trace>-<config>-replay.log
#   metrics/<config>-<role>.prom            /metrics after the config
#   metrics/<config>-<role>-after-<trace>.prom  /metrics after each trace
#   gpu.txt                  nvidia-smi at start, after each config's load, end
#
# Replay exit status in status.txt: 0 ok; 2 some requests failed (results
# written; --fail-on-errors); 124 cut by the time budget (SIGINT: kvc-replay
# wrote what it had, marked interrupted); SKIP/FAIL lines say why a pair
# did not run. The script's own exit status: 0 if every pair ran with status
# 0, else 1.
#
# Re-running with the same OUT_DIR and other CONFIGS/TRACES adds to it (an
# earlier <trace>-<config> directory is renamed *.prev-<time>); compare tables
# cover every config directory present. CONFIGS="" only redoes the compare.
#
# ## CPU dry run (embedded tiny model, both "devices" the CPU)
#
#   KVC_BIN=$PWD/target/debug DEV_A=cpu DEV_B=cpu MODEL_ARGS= RUNS=1 \
#   AG_SESSIONS=2 AG_TURNS=2 AG_SCALE=1/50 MC_REQUESTS=6 MC_SCALE=1/32 \
#   MOONCAKE_TRACE=/work/shared/traces/mooncake_synthetic_trace.jsonl \
#   EXTRA_ARGS="--kv-cache-memory 256MiB" PD_ARGS= nice bash scripts/headline.sh /tmp/headline-dry
#
# ## Settings (env; defaults are for the GPU run)
#
#   KVC_BIN            dir with kvc-server and kvc-replay    [/tmp/kvc-gpu-bin]
#   DEV_A, DEV_B       devices                               [cuda:0, cuda:1]
#   MODEL_ARGS         model flags for every worker (empty: embedded model)
#                      [--model $ROOT/.gpu/qwen3-30b-a3b --load-format dummy]
#                      (a missing --model DIR is unpacked from DIR.tgz if
#                      present; scripts/make_model_dir.sh writes such a DIR)
#   EXTRA_ARGS         extra flags for every worker (not the router)
#                      [--max-num-batched-tokens 8192]
#   PD_ARGS            extra flags for P and D of naive and kvc
#                      [--kv-transport-protocol nvlink_intra] (two GPUs of
#                      one host; empty for the CPU dry run: tcp)
#   DP_ARGS, PREFILL_ARGS, DECODE_ARGS, ROUTER_ARGS
#                      extra flags for dp workers / P / D (naive and kvc) /
#                      the router                                        []
#   CONFIGS            [dp naive kvc]        TRACES   [mooncake agentic]
#                      (the short workload first: the time budget gives each
#                      remaining one an equal share of what is left)
#   RUNS               kvc-replay --runs                                 [3]
#   AG_SESSIONS        agentic sessions                                  [4]
#   AG_TURNS           agentic max turns per session                     [3]
#   AG_SCALE           agentic --scale (empty: omit)                     [1]
#   AG_WINDOW_S        agentic --arrival-window-s (empty: the tool's 60 s
#                      for 50 sessions; 60 * AG_SESSIONS / 50 keeps the
#                      seed trace's arrival rate)                       [4.8]
#   MOONCAKE_TRACE     [$ROOT/.gpu/mooncake_synthetic_trace.jsonl]
#   MC_REQUESTS        Mooncake requests (--max-sessions)               [12]
#   MC_SCALE           Mooncake --scale (empty: omit)                    [1]
#   MC_SKIP            Mooncake requests skipped first (--skip)        [500]
#   KVC_REPLAY_ARGS    extra kvc-replay run flags                        []
#   WARMUP_REQUESTS    plain completions sent to every worker (not the
#                      router) after its config starts, before any replay:
#                      a fresh server's first requests pay one-time costs
#                      (cuBLAS handles, memory pool growth, the first
#                      transfer) that otherwise land in run 1 only       [2]
#   WARMUP_WORDS       prompt length of each, in words (~tokens)       [2000]
#   REQUEST_TIMEOUT_S  kvc-replay --request-timeout-s                  [300]
#   WAIT_READY_S       kvc-replay --wait-ready-s                       [300]
#   READY_TIMEOUT_S    servers' readiness deadline per config          [600]
#   STOP_TIMEOUT_S     SIGTERM -> SIGKILL grace per server              [30]
#   TIME_BUDGET_S      whole script; 0 = none. Pairs get a fair share of
#                      what is left (replay interrupted with SIGINT at the
#                      end of its share, results kept); pairs that cannot
#                      start in time are skipped. Default below the device
#                      tool's 600 s per command.                       [560]
#   BASE_PORT          dp: +0 router, +1/+2 workers; naive: +10 P, +11 D;
#                      kvc: +20 P, +21 D                             [18600]
#   KVC_CLUSTER_TOKEN  worker-to-worker token                   [headline]
#   RUST_LOG           server log filter                              [info]
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ $# -ne 1 ] || [ "${1:0:1}" = - ]; then
    sed -n '2,12p' "$0" >&2
    echo "usage: $0 OUT_DIR   (settings by env: see the header of $0)" >&2
    exit 2
fi
mkdir -p "$1" || exit 1
OUT_DIR=$(cd "$1" && pwd)

KVC_BIN=${KVC_BIN:-/tmp/kvc-gpu-bin}
SERVER=$KVC_BIN/kvc-server
REPLAY=$KVC_BIN/kvc-replay
DEV_A=${DEV_A:-cuda:0}
DEV_B=${DEV_B:-cuda:1}
# ${VAR-default}: an empty MODEL_ARGS is kept (the embedded model).
MODEL_ARGS=${MODEL_ARGS-"--model $ROOT/.gpu/qwen3-30b-a3b --load-format dummy"}
EXTRA_ARGS=${EXTRA_ARGS-"--max-num-batched-tokens 8192"}
PD_ARGS=${PD_ARGS-"--kv-transport-protocol nvlink_intra"}
DP_ARGS=${DP_ARGS:-}
PREFILL_ARGS=${PREFILL_ARGS:-}
DECODE_ARGS=${DECODE_ARGS:-}
ROUTER_ARGS=${ROUTER_ARGS:-}
CONFIGS=${CONFIGS-"dp naive kvc"}
TRACES=${TRACES-"mooncake agentic"}
RUNS=${RUNS:-3}
AG_SESSIONS=${AG_SESSIONS:-4}
AG_TURNS=${AG_TURNS:-3}
AG_SCALE=${AG_SCALE-1}
MOONCAKE_TRACE=${MOONCAKE_TRACE:-$ROOT/.gpu/mooncake_synthetic_trace.jsonl}
MC_REQUESTS=${MC_REQUESTS:-12}
MC_SCALE=${MC_SCALE-1}
MC_SKIP=${MC_SKIP:-500}
AG_WINDOW_S=${AG_WINDOW_S-4.8}
KVC_REPLAY_ARGS=${KVC_REPLAY_ARGS:-}
WARMUP_REQUESTS=${WARMUP_REQUESTS:-2}
WARMUP_WORDS=${WARMUP_WORDS:-2000}
REQUEST_TIMEOUT_S=${REQUEST_TIMEOUT_S:-300}
WAIT_READY_S=${WAIT_READY_S:-300}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-600}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-30}
TIME_BUDGET_S=${TIME_BUDGET_S:-560}
BASE_PORT=${BASE_PORT:-18600}
TOKEN=${KVC_CLUSTER_TOKEN:-headline}
export RUST_LOG=${RUST_LOG:-info}
# Kept for the final teardown and compare when the budget is cut.
RESERVE_S=45

LOG=$OUT_DIR/headline.log
STATUS=$OUT_DIR/status.txt
mkdir -p "$OUT_DIR/logs" "$OUT_DIR/metrics" || exit 1

T0=$SECONDS
log() {
    printf '[%s +%5ds] %s\n' "$(date -u +%H:%M:%S)" $((SECONDS - T0)) "$*" | tee -a "$LOG"
}
# status.txt grows a line per pair as it finishes, so a hard kill leaves
# what was done.
status_line() { # config trace rc wall_s note...
    local c=$1 t=$2 rc=$3 w=$4
    shift 4
    printf '%-6s %-9s %-5s %7s  %s\n' "$c" "$t" "$rc" "$w" "$*" >> "$STATUS"
}

# ---------------------------------------------------------------- processes
# pid -> "config-role"; every server this script started and has not reaped.
declare -A PROC_NAME=()
declare -A PROC_URL=()
REPLAY_PID=""
STOPPING=0   # 1 after the first INT/TERM: finish gracefully
FAILED=0     # any pair not 0

stop_pid() { # pid name: SIGTERM, wait up to STOP_TIMEOUT_S, SIGKILL; reap
    local pid=$1 name=$2 i rc
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for ((i = 0; i < STOP_TIMEOUT_S * 4; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "  $name (pid $pid) still running after ${STOP_TIMEOUT_S}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    log "  stopped $name (pid $pid): exit $rc"
    unset "PROC_NAME[$pid]" "PROC_URL[$pid]"
}

# Stops every server still running, newest first (the router before its
# workers, decode before prefill).
PROC_ORDER=()
stop_all() {
    local i pid
    for ((i = ${#PROC_ORDER[@]} - 1; i >= 0; i--)); do
        pid=${PROC_ORDER[$i]}
        if [ -n "${PROC_NAME[$pid]:-}" ]; then stop_pid "$pid" "${PROC_NAME[$pid]}"; fi
    done
    PROC_ORDER=()
}

kill_replay() {
    if [ -n "$REPLAY_PID" ] && kill -0 "$REPLAY_PID" 2>/dev/null; then
        kill -KILL "$REPLAY_PID" 2>/dev/null
        wait "$REPLAY_PID" 2>/dev/null
    fi
    REPLAY_PID=""
}

on_exit() {
    trap - EXIT INT TERM
    kill_replay
    if [ ${#PROC_NAME[@]} -gt 0 ]; then
        log "exit: stopping ${#PROC_NAME[@]} server(s) left running"
        STOP_TIMEOUT_S=5 stop_all
    fi
}
on_signal() {
    if [ "$STOPPING" = 1 ]; then
        log "second $1: stopping now"
        exit 130
    fi
    STOPPING=1
    log "got $1: interrupting the replay, then teardown, compare and status (again to stop at once)"
    if [ -n "$REPLAY_PID" ]; then kill -INT "$REPLAY_PID" 2>/dev/null; fi
}
trap on_exit EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_server config role port device|- flags... : background, logs to
# logs/<config>-<role>.log; sets STARTED_PID.
start_server() {
    local config=$1 role=$2 port=$3 dev=$4
    shift 4
    local logf=$OUT_DIR/logs/$config-$role.log args=(--host 127.0.0.1 --port "$port")
    if [ "$dev" != - ]; then args+=(--device "$dev"); fi
    if port_busy "$port"; then
        log "  port $port already in use: $config-$role not started"
        return 1
    fi
    echo "# $(date -u +%FT%TZ) $SERVER ${args[*]} $*" > "$logf"
    "$SERVER" "${args[@]}" "$@" >> "$logf" 2>&1 < /dev/null &
    STARTED_PID=$!
    PROC_NAME[$STARTED_PID]=$config-$role
    PROC_ORDER+=("$STARTED_PID")
    PROC_URL[$STARTED_PID]=http://127.0.0.1:$port
    local on=""
    if [ "$dev" != - ]; then on=", device $dev"; fi
    log "  started $config-$role (pid $STARTED_PID) on 127.0.0.1:$port$on: $*"
}

# metric_is_one URL NAME LABELS: /metrics has `NAME{LABELS} 1`.
metric_is_one() {
    curl -s -m 5 "$1/metrics" 2>/dev/null | grep -qE "^$2\{$3\} 1(\.0*)?$"
}

# wait_ready deadline_s pid... : every pid's /health answers 200, plus the
# role's own check (decode: its prefill peer is healthy; router: every worker
# is healthy). Returns 1 when a server dies or the deadline passes.
declare -A READY_CHECK=()
wait_ready() {
    local deadline=$((SECONDS + $1)) pid ok name
    shift
    while :; do
        ok=1
        for pid in "$@"; do
            name=${PROC_NAME[$pid]}
            if ! kill -0 "$pid" 2>/dev/null; then
                log "  $name (pid $pid) died before it was ready; last log lines:"
                tail -n 25 "$OUT_DIR/logs/$name.log" | sed 's/^/    | /' | tee -a "$LOG"
                return 1
            fi
            if [ "$ok" = 1 ]; then
                if ! curl -s -o /dev/null -m 2 -w '%{http_code}' "${PROC_URL[$pid]}/health" 2>/dev/null | grep -q '^200$'; then
                    ok=0
                elif [ -n "${READY_CHECK[$pid]:-}" ] && ! eval "${READY_CHECK[$pid]}"; then
                    ok=0
                fi
            fi
        done
        [ "$ok" = 1 ] && return 0
        if [ "$STOPPING" = 1 ]; then log "  interrupted while waiting for readiness"; return 1; fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "  not ready after $1 s; last log lines:"
            for pid in "$@"; do
                log "  -- ${PROC_NAME[$pid]}"
                tail -n 10 "$OUT_DIR/logs/${PROC_NAME[$pid]}.log" | sed 's/^/    | /' | tee -a "$LOG"
            done
            return 1
        fi
        sleep 0.5
    done
}

save_metrics() { # suffix pid...
    local suffix=$1 pid
    shift
    for pid in "$@"; do
        curl -s -m 10 "${PROC_URL[$pid]}/metrics" > "$OUT_DIR/metrics/${PROC_NAME[$pid]}$suffix.prom" 2>/dev/null \
            || log "  could not read ${PROC_NAME[$pid]} /metrics"
    done
}

gpu_snapshot() {
    if command -v nvidia-smi > /dev/null 2>&1; then
        { echo "== $1 ($(date -u +%FT%TZ))"; timeout 30 nvidia-smi; echo; } >> "$OUT_DIR/gpu.txt" 2>&1
    fi
}

# ------------------------------------------------------------------ budget
split() { read -r -a "$1" <<< "$2"; }  # intentional word splitting of a flag string
read -r -a CONFIG_LIST <<< "$CONFIGS"
read -r -a TRACE_LIST <<< "$TRACES"
PAIRS_LEFT=$((${#CONFIG_LIST[@]} * ${#TRACE_LIST[@]}))
CONFIGS_LEFT=${#CONFIG_LIST[@]}
STARTUP_EST_S=0   # the last config's start-up time, to reserve for later ones

# Seconds the next pair may run, or 0 when it should be skipped.
pair_limit() {
    if [ "$TIME_BUDGET_S" -le 0 ]; then echo 0 && return; fi
    local left=$((TIME_BUDGET_S - (SECONDS - T0) - RESERVE_S - (CONFIGS_LEFT - 1) * STARTUP_EST_S))
    local share=$((left / (PAIRS_LEFT > 0 ? PAIRS_LEFT : 1)))
    if [ "$share" -lt 15 ]; then echo -1; else echo "$share"; fi
}
time_left() { # seconds left of the budget (a large number without one)
    if [ "$TIME_BUDGET_S" -le 0 ]; then echo 999999; else echo $((TIME_BUDGET_S - (SECONDS - T0) - RESERVE_S)); fi
}

# ------------------------------------------------------------------ replay
# run_pair config trace url: one kvc-replay run; appends to status.txt.
run_pair() {
    local config=$1 trace=$2 url=$3
    local dir=$OUT_DIR/$trace-$config limit t rc note="" args
    local rlog=$OUT_DIR/logs/$trace-$config-replay.log
    limit=$(pair_limit)
    if [ "$limit" = -1 ]; then
        log "SKIP $trace on $config: time budget spent"
        status_line "$config" "$trace" SKIP - "time budget spent"
        FAILED=1
        return
    fi
    if [ -e "$dir" ]; then mv "$dir" "$dir.prev-$(date +%s)"; fi
    args=(run --url "$url" --runs "$RUNS" --time-scale 1 --request-timeout-s "$REQUEST_TIMEOUT_S"
          --wait-ready-s "$WAIT_READY_S" --no-progress --fail-on-errors --out "$dir")
    case $trace in
        agentic)
            args+=(--synth agentic --sessions "$AG_SESSIONS" --max-turns "$AG_TURNS")
            if [ -n "$AG_SCALE" ]; then args+=(--scale "$AG_SCALE"); fi
            if [ -n "$AG_WINDOW_S" ]; then args+=(--arrival-window-s "$AG_WINDOW_S"); fi ;;
        mooncake)
            args+=(--trace "$MOONCAKE_TRACE" --skip "$MC_SKIP" --max-sessions "$MC_REQUESTS")
            if [ -n "$MC_SCALE" ]; then args+=(--scale "$MC_SCALE"); fi ;;
    esac
    local extra=()
    split extra "$KVC_REPLAY_ARGS"
    args+=("${extra[@]}")
    log "REPLAY $trace on $config ($url)${limit:+, time limit ${limit}s (0 = none)}"
    echo "# $(date -u +%FT%TZ) $REPLAY ${args[*]}" > "$rlog"
    t=$SECONDS
    "$REPLAY" "${args[@]}" >> "$rlog" 2>&1 < /dev/null &
    REPLAY_PID=$!
    # Watchdog: SIGINT at the time limit (kvc-replay then writes what it
    # has, marked interrupted), SIGKILL 60 s later.
    local interrupted_at=0
    while kill -0 "$REPLAY_PID" 2>/dev/null; do
        if [ "$interrupted_at" = 0 ] && { [ "$STOPPING" = 1 ] || { [ "$limit" -gt 0 ] && [ $((SECONDS - t)) -ge "$limit" ]; }; }; then
            log "  interrupting the replay (SIGINT) after $((SECONDS - t)) s"
            kill -INT "$REPLAY_PID" 2>/dev/null
            interrupted_at=$SECONDS
            note="interrupted (time budget or signal); "
        elif [ "$interrupted_at" != 0 ] && [ $((SECONDS - interrupted_at)) -ge 60 ]; then
            log "  replay still running 60 s after SIGINT: SIGKILL"
            kill -KILL "$REPLAY_PID" 2>/dev/null
        fi
        sleep 1
    done
    wait "$REPLAY_PID"
    rc=$?
    REPLAY_PID=""
    if [ "$interrupted_at" != 0 ]; then
        note="${note}replay exit $rc; "
        rc=124
    fi
    [ "$rc" = 0 ] || FAILED=1
    # The per-run result lines, for the console.
    grep -E '^run [0-9]+/[0-9]+:|^Error' "$rlog" | sed 's/^/    /' | tee -a "$LOG"
    log "  $trace on $config: exit $rc in $((SECONDS - t)) s"
    status_line "$config" "$trace" "$rc" $((SECONDS - t)) "${note}log logs/$trace-$config-replay.log"
}

# warm_up pid...: WARMUP_REQUESTS plain completions (no session, greedy,
# 16 tokens, a prompt nothing in the traces shares) to each server's
# OpenAI endpoint in turn. Logged; a failure is logged and not fatal.
warm_up() {
    local pid url i code body
    [ "$WARMUP_REQUESTS" -gt 0 ] || return 0
    body=$(awk -v n="$WARMUP_WORDS" 'BEGIN { printf "{\"prompt\": \""; for (i = 0; i < n; i++) printf "w%d ", i % 97; printf "\", \"max_tokens\": 16, \"temperature\": 0}" }')
    for pid in "$@"; do
        url=${PROC_URL[$pid]}
        for ((i = 1; i <= WARMUP_REQUESTS; i++)); do
            code=$(curl -s -o /dev/null -w '%{http_code}' -m 120 -H 'Content-Type: application/json' \
                -d "$body" "$url/v1/completions" 2>/dev/null)
            log "  warm-up $i/$WARMUP_REQUESTS -> ${PROC_NAME[$pid]}: HTTP ${code:-none}"
        done
    done
}

# ------------------------------------------------------------------ configs
# start_config config: starts the config's servers, waits until ready.
# Sets CFG_PIDS (all servers) and CFG_URL (where the client goes).
start_config() {
    local config=$1 model=() extra=() pd=() dp=() pf=() dc=() rt=() p d w1 w2
    split model "$MODEL_ARGS"
    split extra "$EXTRA_ARGS"
    split pd "$PD_ARGS"
    split dp "$DP_ARGS"
    split pf "$PREFILL_ARGS"
    split dc "$DECODE_ARGS"
    split rt "$ROUTER_ARGS"
    CFG_PIDS=()
    READY_CHECK=()
    case $config in
        dp)
            local r=$BASE_PORT
            w1=$((BASE_PORT + 1)) w2=$((BASE_PORT + 2))
            start_server dp worker1 "$w1" "$DEV_A" --role both --cluster-token "$TOKEN" \
                "${model[@]}" "${extra[@]}" "${dp[@]}" || return 1
            CFG_PIDS+=("$STARTED_PID")
            start_server dp worker2 "$w2" "$DEV_B" --role both --cluster-token "$TOKEN" \
                "${model[@]}" "${extra[@]}" "${dp[@]}" || return 1
            CFG_PIDS+=("$STARTED_PID")
            wait_ready "$READY_TIMEOUT_S" "${CFG_PIDS[@]}" || return 1
            start_server dp router "$r" - --role router --cluster-token "$TOKEN" \
                --decode-peer "http://127.0.0.1:$w1" --decode-peer "http://127.0.0.1:$w2" "${rt[@]}" || return 1
            CFG_PIDS+=("$STARTED_PID")
            READY_CHECK[$STARTED_PID]="metric_is_one http://127.0.0.1:$r kvc_router_peer_healthy 'worker=\"http://127.0.0.1:$w1\"' && metric_is_one http://127.0.0.1:$r kvc_router_peer_healthy 'worker=\"http://127.0.0.1:$w2\"'"
            CFG_URL=http://127.0.0.1:$r
            ;;
        naive | kvc)
            if [ "$config" = naive ]; then p=$((BASE_PORT + 10)); else p=$((BASE_PORT + 20)); fi
            d=$((p + 1))
            local pflags=(--role prefill --cluster-token "$TOKEN")
            local dflags=(--role decode --cluster-token "$TOKEN" --prefill-peer "http://127.0.0.1:$p")
            if [ "$config" = naive ]; then
                # P keeps its prefix cache; no sessions, no snapshot store.
                pflags+=(--no-enable-session-cache --snapshot-store-blocks 0)
                # D: nothing kept, every turn prefilled on P, no snapshots.
                dflags+=(--no-enable-session-cache --no-enable-prefix-caching
                         --remote-prefill-policy threshold --remote-prefill-min-tokens 1
                         --snapshot-min-tokens 0)
            fi
            start_server "$config" prefill "$p" "$DEV_A" "${pflags[@]}" \
                "${model[@]}" "${extra[@]}" "${pd[@]}" "${pf[@]}" || return 1
            CFG_PIDS+=("$STARTED_PID")
            start_server "$config" decode "$d" "$DEV_B" "${dflags[@]}" \
                "${model[@]}" "${extra[@]}" "${pd[@]}" "${dc[@]}" || return 1
            CFG_PIDS+=("$STARTED_PID")
            READY_CHECK[$STARTED_PID]="metric_is_one http://127.0.0.1:$d kvc_prefill_peer_healthy 'peer=\"http://127.0.0.1:$p\"'"
            CFG_URL=http://127.0.0.1:$d
            ;;
        *)
            log "unknown config '$config' (dp, naive, kvc)"
            return 1
            ;;
    esac
    local left
    left=$(time_left)
    wait_ready $((READY_TIMEOUT_S < left ? READY_TIMEOUT_S : (left > 10 ? left : 10))) "${CFG_PIDS[@]}"
}

# ------------------------------------------------------------------ preflight
echo "==== $(date -u +%FT%TZ) $0 $*" >> "$LOG"
{
    echo "headline experiment, started $(date -u +%FT%TZ) on $(hostname)"
    echo "ROOT=$ROOT"
    for v in KVC_BIN DEV_A DEV_B MODEL_ARGS EXTRA_ARGS PD_ARGS DP_ARGS PREFILL_ARGS DECODE_ARGS ROUTER_ARGS \
             CONFIGS TRACES RUNS AG_SESSIONS AG_TURNS AG_SCALE AG_WINDOW_S MOONCAKE_TRACE MC_REQUESTS MC_SCALE MC_SKIP \
             KVC_REPLAY_ARGS WARMUP_REQUESTS WARMUP_WORDS REQUEST_TIMEOUT_S WAIT_READY_S READY_TIMEOUT_S STOP_TIMEOUT_S TIME_BUDGET_S \
             BASE_PORT RUST_LOG LD_LIBRARY_PATH; do
        printf '%s=%s\n' "$v" "${!v:-}"
    done
    echo "kvc-server: $("$SERVER" --version 2>&1)"
    echo "kvc-replay: $("$REPLAY" --version 2>&1)"
    echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo n/a) $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed paths"
    echo "nproc: $(nproc 2>/dev/null)"
} > "$OUT_DIR/setup.txt" 2>&1

log "headline: configs [$CONFIGS] x traces [$TRACES], $RUNS run(s) each, out $OUT_DIR, budget ${TIME_BUDGET_S}s"
preflight_ok=1
for b in "$SERVER" "$REPLAY"; do
    [ -x "$b" ] || { log "PREFLIGHT: $b missing or not executable (KVC_BIN=$KVC_BIN)"; preflight_ok=0; }
done
command -v curl > /dev/null || { log "PREFLIGHT: curl not found"; preflight_ok=0; }
if [ -x "$SERVER" ] && command -v ldd > /dev/null; then
    missing=$(ldd "$SERVER" 2>/dev/null | grep 'not found')
    if [ -n "$missing" ]; then
        log "PREFLIGHT: kvc-server's libraries not found (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}):"
        echo "$missing" | tee -a "$LOG"
        preflight_ok=0
    fi
fi
# The model directory: unpack DIR.tgz (top-level folder named like DIR) when
# DIR itself is missing.
margs=()
split margs "$MODEL_ARGS"
for ((i = 0; i + 1 < ${#margs[@]}; i++)); do
    [ "${margs[$i]}" = --model ] || continue
    mdir=${margs[$((i + 1))]}
    if [ ! -d "$mdir" ] && [ -f "$mdir.tgz" ]; then
        log "unpacking $mdir.tgz"
        tar xzf "$mdir.tgz" -C "$(dirname "$mdir")" || log "PREFLIGHT: could not unpack $mdir.tgz"
    fi
    if [ ! -f "$mdir/config.json" ] && [ "${mdir:0:1}" = / ]; then
        log "PREFLIGHT: $mdir/config.json not found"
        preflight_ok=0
    elif [ -f "$mdir/config.json" ]; then
        log "model $mdir: $(tr -d '\n ' < "$mdir/config.json" | grep -oE '"(num_hidden_layers|num_experts|hidden_size|max_position_embeddings)":[0-9]+' | tr '\n' ' ')"
    fi
done
for t in "${TRACE_LIST[@]}"; do
    case $t in agentic | mooncake) ;; *) log "PREFLIGHT: unknown trace '$t'"; preflight_ok=0 ;; esac
done
if [ ! -e "$STATUS" ]; then
    printf '%-6s %-9s %-5s %7s  %s\n' config trace rc wall_s note > "$STATUS"
fi
echo "# $(date -u +%FT%TZ) CONFIGS=[$CONFIGS] TRACES=[$TRACES] RUNS=$RUNS" >> "$STATUS"
if [ "$preflight_ok" != 1 ]; then
    status_line - - FAIL - "preflight failed: see headline.log"
    exit 1
fi
# A missing Mooncake trace drops that workload only (the rest still runs).
if [ ${#CONFIG_LIST[@]} -gt 0 ] && [ ! -r "$MOONCAKE_TRACE" ]; then
    kept=()
    for t in "${TRACE_LIST[@]}"; do
        if [ "$t" = mooncake ]; then
            log "PREFLIGHT: Mooncake trace $MOONCAKE_TRACE not readable: mooncake SKIPPED"
            status_line - mooncake SKIP - "trace $MOONCAKE_TRACE not readable"
            FAILED=1
        else
            kept+=("$t")
        fi
    done
    TRACE_LIST=("${kept[@]}")
    if [ ${#TRACE_LIST[@]} -eq 0 ]; then CONFIG_LIST=(); fi
    PAIRS_LEFT=$((${#CONFIG_LIST[@]} * ${#TRACE_LIST[@]}))
fi
gpu_snapshot start

# ------------------------------------------------------------------ main loop
for config in "${CONFIG_LIST[@]}"; do
    if [ "$STOPPING" = 1 ]; then
        for trace in "${TRACE_LIST[@]}"; do status_line "$config" "$trace" SKIP - "interrupted"; done
        FAILED=1
        continue
    fi
    log "CONFIG $config: starting servers"
    t_cfg=$SECONDS
    if [ "$(time_left)" -lt 30 ]; then
        log "SKIP $config: time budget spent"
        for trace in "${TRACE_LIST[@]}"; do status_line "$config" "$trace" SKIP - "time budget spent"; done
        FAILED=1
        PAIRS_LEFT=$((PAIRS_LEFT - ${#TRACE_LIST[@]}))
        CONFIGS_LEFT=$((CONFIGS_LEFT - 1))
        continue
    fi
    if ! start_config "$config"; then
        log "FAIL $config: servers did not start (logs/$config-*.log)"
        save_metrics "" "${CFG_PIDS[@]}"
        stop_all
        why="servers did not start; see logs/$config-*.log"
        if [ "$STOPPING" = 1 ]; then why="interrupted while starting servers"; fi
        for trace in "${TRACE_LIST[@]}"; do status_line "$config" "$trace" FAIL - "$why"; done
        FAILED=1
        PAIRS_LEFT=$((PAIRS_LEFT - ${#TRACE_LIST[@]}))
        CONFIGS_LEFT=$((CONFIGS_LEFT - 1))
        continue
    fi
    workers=()
    for pid in "${CFG_PIDS[@]}"; do
        case ${PROC_NAME[$pid]} in *-router) ;; *) workers+=("$pid") ;; esac
    done
    warm_up "${workers[@]}"
    STARTUP_EST_S=$((SECONDS - t_cfg))
    log "CONFIG $config: ready in ${STARTUP_EST_S} s; client -> $CFG_URL"
    gpu_snapshot "$config loaded"
    dead=""
    for trace in "${TRACE_LIST[@]}"; do
        if [ -n "$dead" ] || [ "$STOPPING" = 1 ]; then
            status_line "$config" "$trace" SKIP - "${dead:+$dead died}${dead:-interrupted}"
            FAILED=1
        else
            run_pair "$config" "$trace" "$CFG_URL"
            save_metrics "-after-$trace" "${CFG_PIDS[@]}"
            for pid in "${CFG_PIDS[@]}"; do
                if ! kill -0 "$pid" 2>/dev/null; then
                    dead="${dead:+$dead, }${PROC_NAME[$pid]}"
                    log "  ${PROC_NAME[$pid]} died during $trace; last log lines:"
                    tail -n 25 "$OUT_DIR/logs/${PROC_NAME[$pid]}.log" | sed 's/^/    | /' | tee -a "$LOG"
                    status_line "$config" "$trace" DIED - "${PROC_NAME[$pid]} died during this trace"
                fi
            done
        fi
        PAIRS_LEFT=$((PAIRS_LEFT - 1))
    done
    log "CONFIG $config: saving metrics, stopping servers"
    save_metrics "" "${CFG_PIDS[@]}"
    stop_all
    CONFIGS_LEFT=$((CONFIGS_LEFT - 1))
    log "CONFIG $config: done in $((SECONDS - t_cfg)) s"
done

# ------------------------------------------------------------------ report
log "COMPARE"
for trace in agentic mooncake; do
    dirs=()
    for config in dp naive kvc; do
        d=$OUT_DIR/$trace-$config
        if [ -f "$d/summary.json" ]; then
            dirs+=("$d")
        else
            # kvc-replay writes no top-level summary (and exits 1) when
            # run 1 of --runs N > 1 is interrupted: compare that run.
            last=$(find "$d" -mindepth 2 -maxdepth 2 -path "$d/run-*/summary.json" 2>/dev/null | sort -V | tail -n 1)
            if [ -n "$last" ]; then
                log "$trace-$config: no aggregate summary; comparing $(dirname "$last")"
                dirs+=("$(dirname "$last")")
            fi
        fi
    done
    [ ${#dirs[@]} -gt 0 ] || continue
    if "$REPLAY" compare "${dirs[@]}" > "$OUT_DIR/compare-$trace.md" 2> "$OUT_DIR/logs/compare-$trace.err"; then
        log "compare-$trace.md (${#dirs[@]} configs):"
        tee -a "$LOG" < "$OUT_DIR/compare-$trace.md"
    else
        log "kvc-replay compare failed for $trace: $(head -c 500 "$OUT_DIR/logs/compare-$trace.err")"
        FAILED=1
    fi
done
# Path mix per config (which path each request took, as the server said):
# compare has no path table and a multi-run aggregate has none, so this takes
# each run's "## Path mix" section.
path_mix() { awk '/^## Path mix/{on=1; next} on && /^## /{exit} on && NF' "$1"; }
for trace in agentic mooncake; do
    pm=$OUT_DIR/paths-$trace.md
    : > "$pm"
    for config in dp naive kvc; do
        d=$OUT_DIR/$trace-$config
        [ -d "$d" ] || continue
        for f in "$d/summary.md" "$d"/run-*/summary.md; do
            if [ ! -f "$f" ] || ! grep -q '^## Path mix' "$f"; then continue; fi
            {
                printf '### %s %s%s\n\n' "$trace" "$config" "$(basename "$(dirname "$f")" | sed -n 's/^run-/ run /p')"
                path_mix "$f"
                echo
            } >> "$pm"
        done
    done
    if [ -s "$pm" ]; then
        log "paths-$trace.md:"
        tee -a "$LOG" < "$pm"
    else
        rm -f "$pm"
    fi
done
gpu_snapshot end
log "STATUS ($STATUS):"
tee -a "$LOG" < "$STATUS"
log "done in $((SECONDS - T0)) s"
[ "$FAILED" = 0 ]
