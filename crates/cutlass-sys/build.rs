//! Compiles cpp/moe_gemm.cu with nvcc against CUTLASS's headers when they
//! are there: `KVC_CUTLASS_INCLUDE`, else
//! `<workspace>/.cuda-build/cutlass/include` (filled by
//! scripts/cutlass_setup.sh from the pinned, hash-checked `nvidia-cutlass`
//! wheel), for sm90a, linking the CUDA runtime dynamically. The object
//! takes nvcc about 2 minutes on 2 cores; only the `cuda` build needs it.
//!
//! Without nvcc (`CUDA_ROOT`) it builds the "none" variant silently (CPU
//! builds, CI); with nvcc but without the headers it says so, and
//! `check()` fails naming the setup script.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvc_cutlass)");
    println!("cargo:rerun-if-changed=cpp/moe_gemm.cu");
    println!("cargo:rerun-if-changed=cpp/moe_gemm.h");
    println!("cargo:rerun-if-env-changed=KVC_CUTLASS_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.parent().and_then(Path::parent).expect("crates/cutlass-sys sits two levels below the workspace");
    let include = env::var_os("KVC_CUTLASS_INCLUDE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join(".cuda-build/cutlass/include"));
    let Some(root) = env::var_os("CUDA_ROOT").map(PathBuf::from) else { return };
    let nvcc = root.join("bin/nvcc");
    if !nvcc.is_file() || !root.join("include/cuda_runtime.h").is_file() {
        return none(&format!("{} has no bin/nvcc or include/cuda_runtime.h", root.display()));
    }
    if !include.join("cutlass/cutlass.h").is_file() || !include.join("cute/tensor.hpp").is_file() {
        return none(&format!("{} lacks cutlass/cutlass.h or cute/tensor.hpp", include.display()));
    }
    println!("cargo:rerun-if-changed={}", include.join(".pins").display());
    // nvcc itself (cc's CUDA mode passes host flags to nvcc unwrapped),
    // then cc archives the object.
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let obj = out.join("moe_gemm.o");
    let status = std::process::Command::new(&nvcc)
        .args(["-std=c++17", "-O3", "-arch=sm_90a", "--expt-relaxed-constexpr", "-w", "-DNDEBUG", "-Xcompiler", "-fPIC"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-I{}", manifest.join("cpp").display()))
        .arg("-c")
        .arg(manifest.join("cpp/moe_gemm.cu"))
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
    assert!(status.success(), "nvcc failed on cpp/moe_gemm.cu");
    cc::Build::new().object(&obj).compile("kvc_cutlass_moe_gemm");
    // The CUDA runtime, as candle's own build links it (scripts/cuda_setup.sh
    // puts an unversioned libcudart.so on LIBRARY_PATH).
    println!("cargo:rustc-link-lib=dylib=cudart");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo:rustc-cfg=kvc_cutlass");
}

fn none(why: &str) {
    println!("cargo:warning=kvc-cutlass-sys: built without CUTLASS ({why}); run scripts/cutlass_setup.sh for the Hopper expert GEMMs");
}
