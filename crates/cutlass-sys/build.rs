//! Compiles cpp/moe_gemm.cu (the bf16 grouped GEMM for the MoE experts)
//! and cpp/fp8_gemm.cu (the block-scaled FP8 GEMMs, dense and grouped,
//! their activation quantization and self-tests) with nvcc against
//! CUTLASS's headers when they are there: `KVC_CUTLASS_INCLUDE`, else
//! `<workspace>/.cuda-build/cutlass/include` (filled by
//! scripts/cutlass_setup.sh from the pinned, hash-checked `nvidia-cutlass`
//! wheel), for sm90a, into one static library, linking the CUDA runtime
//! dynamically. The two nvcc runs go in parallel; moe_gemm.o takes nvcc
//! about 2 minutes on 2 cores, fp8_gemm.o (two CUTLASS FP8 kernels plus
//! the quantization and test kernels) about 75 s of CPU, 5 minutes of wall
//! time on a 2-core machine shared with other builds (load 9); only the
//! `cuda` build needs them.
//!
//! Without nvcc (`CUDA_ROOT`) it builds the "none" variant silently (CPU
//! builds, CI); with nvcc but without the headers it says so, and
//! `check()` / `fp8::check()` fail naming the setup script.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvc_cutlass)");
    println!("cargo:rerun-if-changed=cpp/moe_gemm.cu");
    println!("cargo:rerun-if-changed=cpp/moe_gemm.h");
    println!("cargo:rerun-if-changed=cpp/fp8_gemm.cu");
    println!("cargo:rerun-if-changed=cpp/fp8_gemm.h");
    println!("cargo:rerun-if-changed=cpp/cutlass_call.h");
    println!("cargo:rerun-if-changed=cpp/expert_groups.h");
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
    // both sources at once, then cc archives the objects.
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let units = ["moe_gemm", "fp8_gemm"];
    let children: Vec<_> = units
        .iter()
        .map(|unit| {
            let child = std::process::Command::new(&nvcc)
                .args(["-std=c++17", "-O3", "-arch=sm_90a", "--expt-relaxed-constexpr", "-w", "-DNDEBUG", "-Xcompiler", "-fPIC"])
                .arg(format!("-I{}", include.display()))
                .arg(format!("-I{}", root.join("include").display()))
                .arg(format!("-I{}", manifest.join("cpp").display()))
                .arg("-c")
                .arg(manifest.join(format!("cpp/{unit}.cu")))
                .arg("-o")
                .arg(out.join(format!("{unit}.o")))
                .spawn()
                .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
            (unit, child)
        })
        .collect();
    let mut build = cc::Build::new();
    for (unit, mut child) in children {
        let status = child.wait().unwrap_or_else(|e| panic!("waiting for nvcc on cpp/{unit}.cu: {e}"));
        assert!(status.success(), "nvcc failed on cpp/{unit}.cu");
        build.object(out.join(format!("{unit}.o")));
    }
    build.compile("kvc_cutlass_moe_gemm");
    // The CUDA runtime, as candle's own build links it (scripts/cuda_setup.sh
    // puts an unversioned libcudart.so on LIBRARY_PATH).
    println!("cargo:rustc-link-lib=dylib=cudart");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo:rustc-cfg=kvc_cutlass");
}

fn none(why: &str) {
    println!("cargo:warning=kvc-cutlass-sys: built without CUTLASS ({why}); run scripts/cutlass_setup.sh for the Hopper GEMMs");
}
