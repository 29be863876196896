//! With the `cuda` feature, compiles kernels/*.cu (repo root) to PTX with
//! nvcc (scripts/cuda_setup.sh provides the pinned CUDA 13.0 toolchain and
//! sets CUDA_ROOT); the PTX is embedded in the crate and loaded at start-up.
//! Without the feature it does nothing, so CPU builds need no CUDA.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: &[&str] = &["layers", "attention", "moe", "gemv"];

fn main() {
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../kernels");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|r| PathBuf::from(r).join("bin/nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let arch = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let arch = if arch == "90" { "sm_90a".to_string() } else { format!("sm_{arch}") };
    println!("cargo:rerun-if-changed={}", dir.join("common.cuh").display());
    for k in KERNELS {
        let src = dir.join(format!("{k}.cu"));
        println!("cargo:rerun-if-changed={}", src.display());
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-ptx", "-O3", "-std=c++17", &format!("-arch={arch}")]);
        if let Some(root) = std::env::var_os("CUDA_ROOT") {
            cmd.arg(format!("-I{}", PathBuf::from(root).join("include").display()));
        }
        cmd.arg("-o").arg(out.join(format!("{k}.ptx"))).arg(&src);
        let status = cmd.status().unwrap_or_else(|e| panic!("running {} (set CUDA_ROOT; see scripts/cuda_setup.sh): {e}", nvcc.display()));
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}
