//! Compiles cpp/sdpa.cpp against cuDNN's headers when they are there:
//! `KVC_CUDNN_INCLUDE`, else `<workspace>/.cuda-build/cudnn/include`
//! (filled by scripts/cudnn_setup.sh from pinned, hash-checked PyPI
//! wheels: the cuDNN frontend's header-only C++ API, cuDNN 9's C headers,
//! NVRTC's header), plus the CUDA headers under `CUDA_ROOT/include`.
//! Nothing is linked: the frontend opens libcudnn at run time.
//!
//! Without the headers the crate builds its "none" variant, whose
//! `Cudnn::open` fails with a message naming the setup script (CPU builds
//! and CI never need cuDNN).

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvc_cudnn)");
    println!("cargo:rerun-if-changed=cpp/sdpa.cpp");
    println!("cargo:rerun-if-changed=cpp/sdpa.h");
    println!("cargo:rerun-if-env-changed=KVC_CUDNN_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.parent().and_then(Path::parent).expect("crates/cudnn-sys sits two levels below the workspace");
    let include = env::var_os("KVC_CUDNN_INCLUDE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join(".cuda-build/cudnn/include"));
    let cuda_include = env::var_os("CUDA_ROOT").map(|r| PathBuf::from(r).join("include"));
    let have = |dir: &Path, file: &str| dir.join(file).is_file();
    let cuda_include = match cuda_include {
        Some(c) if have(&c, "cuda_runtime.h") => c,
        // A CPU build: no CUDA toolchain, nothing to say.
        None => return,
        Some(c) => return none(&format!("{} has no cuda_runtime.h", c.display())),
    };
    if !have(&include, "cudnn_frontend.h") || !have(&include, "cudnn.h") || !have(&include, "nvrtc.h") {
        return none(&format!("{} lacks cudnn_frontend.h, cudnn.h or nvrtc.h", include.display()));
    }
    println!("cargo:rerun-if-changed={}", include.join("cudnn_frontend_version.h").display());
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .define("NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", None)
        .include(&include)
        .include(&cuda_include)
        .include(manifest.join("cpp"))
        .warnings(false)
        .file(manifest.join("cpp/sdpa.cpp"))
        .compile("kvc_cudnn_sdpa");
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rustc-cfg=kvc_cudnn");
}

fn none(why: &str) {
    println!("cargo:warning=kvc-cudnn-sys: built without cuDNN ({why}); run scripts/cudnn_setup.sh for the cuDNN attention path");
}
