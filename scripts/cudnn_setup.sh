#!/usr/bin/env bash
# Headers for kvc's cuDNN attention path (crates/cudnn-sys), from pinned,
# hash-checked PyPI wheels, into .cuda-build/cudnn/include (ignored, never
# committed):
#   - nvidia-cudnn-frontend: the cuDNN frontend's header-only C++ graph API;
#   - nvidia-cudnn-cu13: cuDNN 9's C headers (the wheel's libraries are not
#     used: kvc opens libcudnn at run time, on the GPU machine the one in
#     PyTorch's wheels);
#   - nvidia-cuda-nvrtc: nvrtc.h, which the frontend includes.
# Called by scripts/cuda_setup.sh; CPU builds and CI never need it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# The frontend includes "../include/...": the folder must be named include.
DEST=$ROOT/.cuda-build/cudnn/include
WHEELS=$ROOT/.cuda-build/wheels
STAMP=$DEST/.pins
PINS='nvidia-cudnn-frontend==1.32.0 --hash=sha256:c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
nvidia-cudnn-cu13==9.19.0.56 --hash=sha256:d20e1734305e9d68889a96e3f35094d733ff1f83932ebe462753973e53a572bf
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575'

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ]; then
    exit 0
fi
mkdir -p "$WHEELS"
printf '%s\n' "$PINS" > "$WHEELS/requirements.txt"
python3 -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_12_x86_64 \
    --platform manylinux2010_x86_64 -r "$WHEELS/requirements.txt" -d "$WHEELS"
rm -rf "$DEST" "$WHEELS/x"
mkdir -p "$DEST" "$WHEELS/x"
python3 - "$WHEELS" <<'PY'
import glob, sys, zipfile
w = sys.argv[1]
for pattern, prefix in [("nvidia_cudnn_frontend-1.32.0-*.whl", "include/"),
                        ("nvidia_cudnn_cu13-9.19.0.56-*.whl", "nvidia/cudnn/include/"),
                        ("nvidia_cuda_nvrtc-13.0.88-*.whl", "nvidia/cu13/include/")]:
    (path,) = glob.glob(f"{w}/{pattern}")
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                z.extract(name, f"{w}/x")
PY
cp -r "$WHEELS/x/include/." "$DEST/"
cp "$WHEELS"/x/nvidia/cudnn/include/*.h "$DEST/"
cp "$WHEELS/x/nvidia/cu13/include/nvrtc.h" "$DEST/"
rm -rf "$WHEELS/x"
printf '%s' "$PINS" > "$STAMP"
echo "cuDNN headers in $DEST"
