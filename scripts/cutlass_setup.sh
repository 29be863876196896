#!/usr/bin/env bash
# CUTLASS's headers for kvc's Hopper expert GEMMs (crates/cutlass-sys),
# from the pinned, hash-checked `nvidia-cutlass` PyPI wheel (BSD-3), into
# .cuda-build/cutlass/include (ignored, never committed): CUTLASS's and
# CuTe's headers (the wheel's cutlass_library/source/include) and its
# utility headers (source/tools/util/include).
# Called by scripts/cuda_setup.sh; CPU builds and CI never need it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/.cuda-build/cutlass/include
WHEELS=$ROOT/.cuda-build/wheels
STAMP=$DEST/.pins
PINS='nvidia-cutlass==4.2.0.0 --hash=sha256:f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6'

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ]; then
    exit 0
fi
mkdir -p "$WHEELS"
printf '%s\n' "$PINS" > "$WHEELS/cutlass-requirements.txt"
python3 -m pip download -q --no-deps --require-hashes --only-binary=:all: \
    -r "$WHEELS/cutlass-requirements.txt" -d "$WHEELS"
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$WHEELS" "$DEST" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1], sys.argv[2]
(path,) = glob.glob(f"{wheels}/nvidia_cutlass-4.2.0.0-*.whl")
roots = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(path) as z:
    for name in z.namelist():
        for root in roots:
            if name.startswith(root) and not name.endswith("/"):
                out = os.path.join(dest, name[len(root):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(name) as src, open(out, "wb") as dst:
                    dst.write(src.read())
PY
test -f "$DEST/cutlass/cutlass.h" && test -f "$DEST/cute/tensor.hpp" && test -f "$DEST/cutlass/util/packed_stride.hpp"
printf '%s' "$PINS" > "$STAMP"
echo "CUTLASS headers in $DEST"
