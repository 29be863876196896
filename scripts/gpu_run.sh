#!/usr/bin/env bash
# Runs a command with kvc's GPU binaries on a machine with an NVIDIA GPU
# (the lent H200: no Rust there, so the binaries are built here by
# scripts/cuda_setup.sh and carried in .gpu/).
#
#   scripts/gpu_run.sh stage               # here: copy binaries, GPU tests, fixtures into .gpu/
#   scripts/gpu_run.sh kvc-bench engine --shape qwen3-30b-a3b   # there
#   scripts/gpu_run.sh tests               # there: every GPU test (the #[ignore]d ones)
#
# On the device the command runs with LD_LIBRARY_PATH pointing at the CUDA
# 13 libraries (cudart, cublas, cublasLt, curand, nvrtc) shipped with
# PyTorch's pip wheels, or at $KVC_CUDA_LIBS, and at cuDNN 9's (same
# wheels, or $KVC_CUDNN_LIBS).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=$ROOT/.gpu

if [ "${1:-}" = stage ]; then
    mkdir -p "$G"
    # GPU test binaries (built by cuda_setup.sh with --tests).
    for t in gpu gpu_attention gpu_layers gpu_fp8 fp8_gemm; do
        exe=$(ls -t "$ROOT"/target/cuda/release/deps/$t-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
        [ -n "$exe" ] && gzip -9 -c "$exe" > "$G/test-$t.gz"
    done
    rm -rf "$G/fixtures"
    cp -r "$ROOT/crates/model-qwen3/tests/fixtures" "$G/fixtures"
    cp "$0" "$G/gpu_run.sh"
    du -sh "$G"
    exit 0
fi

LIBS=${KVC_CUDA_LIBS:-$(ls -d /opt/torch/.venv/lib/python3.*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)}
if [ -z "$LIBS" ]; then
    LIBS=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null || true)
fi
# cuDNN 9 (the prefill attention path opens libcudnn.so.9 at run time):
# PyTorch's wheel beside the CUDA libraries, or $KVC_CUDNN_LIBS.
CUDNN=${KVC_CUDNN_LIBS:-$(ls -d "$LIBS"/../../cudnn/lib 2>/dev/null | head -1)}
export LD_LIBRARY_PATH=${LIBS}${CUDNN:+:$CUDNN}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Mooncake's CUDA runtime (scripts/mooncake_cuda_stage.sh): engine.so and
# its libraries first; the Debian libraries it was staged with only where
# this machine has none of that name.
if [ -f "$G/mooncake.tgz" ]; then
    MC=/tmp/kvc-mooncake
    if [ ! -d "$MC/lib" ]; then
        mkdir -p "$MC/fallback"
        tar xzf "$G/mooncake.tgz" -C "$MC"
        for f in "$MC"/sys/*; do
            n=$(basename "$f")
            ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$n " || ln -sf "$f" "$MC/fallback/$n"
        done
    fi
    export LD_LIBRARY_PATH=$MC/lib:$LD_LIBRARY_PATH:$MC/fallback
fi
BIN=/tmp/kvc-gpu-bin
mkdir -p "$BIN"
# Binaries come gzip'd or, where the carry limit is tight, xz'd (Python's
# lzma where the machine has no xz).
unxz_c() { if command -v xz > /dev/null; then xz -dc "$1"; else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi; }
for f in "$G"/*.gz "$G"/*.xz; do
    [ -f "$f" ] || continue
    b=$(basename "$f"); b=${b%.gz}; b=${b%.xz}
    [ -x "$BIN/$b" ] && continue
    case "$f" in *.xz) unxz_c "$f" > "$BIN/$b" ;; *) gunzip -c "$f" > "$BIN/$b" ;; esac
    chmod +x "$BIN/$b"
done
export KVC_FIXTURES=$G/fixtures
case "${1:-}" in
    tests)
        # Every GPU test binary; the arguments (a name filter, say) go to each.
        shift
        rc=0
        for t in "$BIN"/test-*; do "$t" --ignored --test-threads 1 --nocapture "$@" || rc=1; done
        exit $rc ;;
    kvc-*) b=$1; shift; exec "$BIN/$b" "$@" ;;
    *) exec "$@" ;;
esac
