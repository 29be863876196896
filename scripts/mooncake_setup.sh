#!/usr/bin/env bash
# Idempotent set-up of the Mooncake Transfer Engine for kvc's `mooncake-sys`
# crate (issue 5):
#
#   1. the Debian runtime libraries engine.so needs (libibverbs1,
#      ibverbs-providers, libnuma1, libcurl4), and g++ when no C++ compiler
#      is there (the shim is C++), installed with apt-get when missing
#      (needs root, as in CI);
#   2. the pinned PyPI wheel `mooncake-transfer-engine-non-cuda`, downloaded
#      with pip into the project-local cache `.mooncake/` (ignored by git:
#      the directory carries its own `.gitignore`), its sha256 checked
#      against the pin below;
#   3. the wheel unpacked into `.mooncake/wheel/`, its METADATA version
#      checked against the versions whose ABI layout mooncake-sys has
#      verified (crates/mooncake-sys/build.rs checks it again at build time).
#
# `cargo build -p kvc-mooncake-sys` then finds `.mooncake/wheel/` by itself
# (or whatever MOONCAKE_WHEEL_DIR names). Run it again at will: every step
# is skipped when already done.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${MOONCAKE_CACHE_DIR:-$ROOT/.mooncake}"
PYTHON="${PYTHON:-python3}"

# The pin. Changing it means verifying the new wheel's ABI layouts (see
# crates/mooncake-sys/src/verified.rs and shared/docs/MOONCAKE.md) first.
DIST="mooncake-transfer-engine-non-cuda"
VERSION="0.3.13.post1"
WHEEL="mooncake_transfer_engine_non_cuda-0.3.13.post1-cp311-cp311-manylinux_2_28_x86_64.whl"
SHA256="ca9f668a04ffe648b250fda28b97d0a7da149cb110dec5cf3d166a9e68afc940"
# Versions whose TransferEngine / TransferRequest / TransferStatus / Status
# layouts were verified (keep in step with crates/mooncake-sys/src/verified.rs).
VERIFIED_VERSIONS=("0.3.13" "0.3.13.post1")

DEB_PACKAGES=(libibverbs1 ibverbs-providers libnuma1 libcurl4)
# mooncake-sys compiles its C++ shim with the system C++ compiler.
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || DEB_PACKAGES+=(g++)

log() { echo "mooncake_setup: $*"; }
die() { echo "mooncake_setup: error: $*" >&2; exit 1; }

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    die "the pinned wheel is for Linux x86_64 only (this is $(uname -s)-$(uname -m))"
fi

# 1. Debian runtime packages -------------------------------------------------
missing=()
for p in "${DEB_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    log "Debian packages already installed (${DEB_PACKAGES[*]})"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to install: ${missing[*]}"
        SUDO="sudo"
    fi
    log "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. the pinned wheel, sha256-checked -----------------------------------------
mkdir -p "$CACHE/download"
# Keep the cache out of git without touching the repository's .gitignore.
[ -f "$CACHE/.gitignore" ] || printf '# project-local Mooncake cache (scripts/mooncake_setup.sh)\n*\n' >"$CACHE/.gitignore"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$CACHE/download/$WHEEL" ] && [ "$(sha_of "$CACHE/download/$WHEEL")" = "$SHA256" ]; then
    log "wheel already downloaded ($WHEEL)"
else
    rm -f "$CACHE/download/$WHEEL"
    # pip from $PYTHON, else from the project's .venv (scripts/ci_setup.sh).
    PIP_PYTHON=""
    for py in "$PYTHON" "$ROOT/.venv/bin/python"; do
        if "$py" -m pip --version >/dev/null 2>&1; then PIP_PYTHON="$py"; break; fi
    done
    [ -n "$PIP_PYTHON" ] || die "no pip found (tried $PYTHON and .venv/bin/python): install python3-pip or run scripts/ci_setup.sh first"
    log "downloading $DIST==$VERSION from PyPI"
    # --python-version/--platform pin the exact file whatever this machine's
    # Python is: engine.so is loaded without libpython, so its cp311 tag
    # does not matter. --require-hashes makes pip itself check the pin too.
    req="$CACHE/download/requirements.txt"
    printf '%s==%s --hash=sha256:%s\n' "$DIST" "$VERSION" "$SHA256" >"$req"
    "$PIP_PYTHON" -m pip download --quiet --disable-pip-version-check \
        --no-deps --only-binary=:all: --require-hashes \
        --python-version 3.11 --implementation cp --abi cp311 \
        --platform manylinux_2_28_x86_64 \
        --dest "$CACHE/download" -r "$req"
    [ -f "$CACHE/download/$WHEEL" ] || die "pip did not produce $WHEEL"
fi
got="$(sha_of "$CACHE/download/$WHEEL")"
[ "$got" = "$SHA256" ] || die "sha256 of $WHEEL is $got, expected $SHA256 (refusing it)"

# 3. unpack and check the version against the verified layouts --------------
DEST="$CACHE/wheel"
STAMP="$DEST/.kvc-unpacked-sha256"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SHA256" ] && [ -f "$DEST/mooncake/engine.so" ]; then
    log "wheel already unpacked in $DEST"
else
    log "unpacking into $DEST"
    rm -rf "$DEST.tmp" "$DEST"
    mkdir -p "$DEST.tmp"
    "$PYTHON" -m zipfile -e "$CACHE/download/$WHEEL" "$DEST.tmp"
    # zipfile drops the executable bits; the bundled benchmark needs them.
    chmod +x "$DEST.tmp"/mooncake/transfer_engine_bench 2>/dev/null || true
    echo "$SHA256" >"$DEST.tmp/.kvc-unpacked-sha256"
    mv "$DEST.tmp" "$DEST"
    # A build made before the wheel existed linked nothing; make cargo rerun
    # mooncake-sys's build script so the next build links the wheel.
    touch "$ROOT/crates/mooncake-sys/build.rs" 2>/dev/null || true
fi

metadata="$(ls "$DEST"/mooncake_transfer_engine*.dist-info/METADATA 2>/dev/null | head -n1 || true)"
[ -n "$metadata" ] || die "no mooncake_transfer_engine*.dist-info/METADATA in $DEST"
have="$(sed -n 's/^Version: //p' "$metadata" | head -n1 | tr -d '\r')"
ok=0
for v in "${VERIFIED_VERSIONS[@]}"; do [ "$have" = "$v" ] && ok=1; done
[ "$ok" -eq 1 ] || die "wheel version $have has no verified ABI layout (verified: ${VERIFIED_VERSIONS[*]}); refusing it"

# The dynamic loader must find everything engine.so needs.
if ldd "$DEST/mooncake/engine.so" | grep -q "not found"; then
    ldd "$DEST/mooncake/engine.so" | grep "not found" >&2
    die "engine.so has unresolved libraries (see above)"
fi

if [ "$DEST" = "$ROOT/.mooncake/wheel" ]; then
    log "ready: $DIST $have in $DEST (cargo builds find it there)"
else
    log "ready: $DIST $have in $DEST (build with MOONCAKE_WHEEL_DIR=$DEST)"
fi
