#!/usr/bin/env bash
# Stages what scripts/load_bench.sh needs on the device into .gpu/, within
# the device's 64 MiB carry limit (working tree included):
#
#   scripts/load_bench_stage.sh          # here, then: run with carry [".gpu"]
#
# - the CUDA binaries (scripts/cuda_setup.sh with KVC_GPU_TESTS=0: the GPU
#   test binaries are not built), fully stripped; GPU test binaries and
#   fixtures of an earlier staging are set aside (target/gpu-stash/) since
#   the load run does not use them;
# - Mooncake's CUDA runtime (scripts/mooncake_cuda_stage.sh): kvc-server
#   needs engine.so to start;
# - kvc-replay (host build) and the public trace, gzip'd.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=$ROOT/.gpu
TRACE=${MOONCAKE_TRACE:-/work/shared/traces/mooncake_synthetic_trace.jsonl}
KVC_GPU_TESTS=0 bash "$ROOT/scripts/cuda_setup.sh"
[ -f "$G/mooncake.tgz" ] || bash "$ROOT/scripts/mooncake_cuda_stage.sh"
mkdir -p "$ROOT/target/gpu-stash"
rm -rf "$ROOT/target/gpu-stash/fixtures"
mv "$G"/test-*.gz "$ROOT/target/gpu-stash/" 2>/dev/null || true
[ -d "$G/fixtures" ] && mv "$G/fixtures" "$ROOT/target/gpu-stash/"
tmp=$(mktemp -d)
# xz, not gzip: ~7 MB less each, which the carry limit needs
# (scripts/gpu_run.sh unpacks either).
for b in kvc-bench kvc-server; do
    [ -f "$G/$b.gz" ] || continue
    gunzip -c "$G/$b.gz" > "$tmp/$b" && strip --strip-all "$tmp/$b" && xz -9 -T0 -c "$tmp/$b" > "$G/$b.xz" && rm "$G/$b.gz"
done
rm -rf "$tmp"
(cd "$ROOT" && cargo build --release -q -p kvc-replay)
gzip -9 -c "$ROOT/target/release/kvc-replay" > "$G/kvc-replay.gz"
gzip -9 -c "$TRACE" > "$G/mooncake_synthetic_trace.jsonl.gz"
[ -f "$G/qwen3-30b-a3b/config.json" ] || bash "$ROOT/scripts/make_model_dir.sh" "$G/qwen3-30b-a3b"
du -sh "$G"
