//! Passes on what mooncake-sys's build found (`links = "mooncake"`):
//! the run-time library path of a source-built Mooncake (the wheel needs
//! none: engine.so is linked by absolute path), and the "Mooncake alone"
//! driver kvc-transfer-bench compares against.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MOONCAKE_RPATH");
    println!("cargo:rerun-if-env-changed=DEP_MOONCAKE_ALONE_BENCH");
    if let Ok(dir) = std::env::var("DEP_MOONCAKE_RPATH") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    let alone = std::env::var("DEP_MOONCAKE_ALONE_BENCH").unwrap_or_default();
    println!("cargo:rustc-env=KVC_MOONCAKE_ALONE_BENCH={alone}");
}
