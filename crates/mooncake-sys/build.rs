//! Finds a Mooncake Transfer Engine to link, in this order:
//!
//! 1. `KVC_MOONCAKE_DISABLE=1`: none (the "not available" build).
//! 2. `MOONCAKE_ROOT`: a source-built Mooncake install whose
//!    `lib/libtransfer_engine.so` exports the C API itself.
//! 3. `MOONCAKE_WHEEL_DIR`, else `<workspace>/.mooncake/wheel` (what
//!    `scripts/mooncake_setup.sh` unpacks): an unpacked PyPI wheel (or a
//!    site-packages directory it was pip-installed into) holding
//!    `mooncake/engine.so` and `mooncake_transfer_engine*.dist-info/METADATA`.
//!    Its name and version must be in `src/verified.rs`; any other is
//!    refused. The C API is provided by `cpp/shim.cpp` over engine.so's C++
//!    class, with `cpp/python_stubs.c` standing in for libpython.
//! 4. Nothing found: the "not available" build, where every entry point
//!    fails and `mooncake_sys::ensure_available()` names what to install.
//!
//! Sets `cfg(mooncake = "wheel" | "source" | "none")` and, for dependent
//! build scripts (`links = "mooncake"`), `DEP_MOONCAKE_MODE`,
//! `DEP_MOONCAKE_RPATH` (source linkage: where the library lives) and
//! `DEP_MOONCAKE_ALONE_BENCH` (wheel linkage: the C++ baseline driver).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

include!("src/verified.rs");

const SETUP_HINT: &str = "run `bash scripts/mooncake_setup.sh` (Debian packages + the pinned wheel into .mooncake/)";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(mooncake, values(\"wheel\", \"source\", \"none\"))");
    for f in ["build.rs", "src/verified.rs", "cpp/shim.cpp", "cpp/python_stubs.c", "cpp/mooncake_c_api.h", "cpp/mooncake_alone_bench.cpp"] {
        println!("cargo:rerun-if-changed={f}");
    }
    for v in ["KVC_MOONCAKE_DISABLE", "MOONCAKE_ROOT", "MOONCAKE_WHEEL_DIR"] {
        println!("cargo:rerun-if-env-changed={v}");
    }

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace =
        manifest.parent().and_then(Path::parent).expect("crates/mooncake-sys sits two levels below the workspace").to_path_buf();

    if env::var("KVC_MOONCAKE_DISABLE").is_ok_and(|v| v == "1") {
        return none("KVC_MOONCAKE_DISABLE=1");
    }
    if let Some(root) = env::var_os("MOONCAKE_ROOT").filter(|v| !v.is_empty()) {
        return source(Path::new(&root));
    }
    let (wheel_dir, explicit) = match env::var_os("MOONCAKE_WHEEL_DIR").filter(|v| !v.is_empty()) {
        Some(d) => (PathBuf::from(d), true),
        None => (workspace.join(".mooncake").join("wheel"), false),
    };
    if wheel_dir.join("mooncake").join("engine.so").is_file() {
        return wheel(&wheel_dir);
    }
    if explicit {
        panic!(
            "MOONCAKE_WHEEL_DIR={} has no mooncake/engine.so; point it at an unpacked mooncake-transfer-engine wheel or {SETUP_HINT}",
            wheel_dir.display()
        );
    }
    // scripts/mooncake_setup.sh touches build.rs when it installs the wheel,
    // so this build script reruns then; watching the missing directory would
    // rerun it (and rebuild every dependent) on each build instead.
    none("no wheel in .mooncake/wheel and neither MOONCAKE_WHEEL_DIR nor MOONCAKE_ROOT set")
}

fn none(why: &str) {
    println!("cargo:rustc-cfg=mooncake=\"none\"");
    println!("cargo:rustc-env=KVC_MOONCAKE_LINKAGE=none ({why})");
    println!("cargo:mode=none");
}

/// Name and version from the single `mooncake_transfer_engine*.dist-info`.
fn wheel_metadata(dir: &Path) -> (String, String, PathBuf) {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())) {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("mooncake_transfer_engine") && name.ends_with(".dist-info") {
            found.push(dir.join(name).join("METADATA"));
        }
    }
    let [metadata] = found.as_slice() else {
        panic!(
            "{} holds {} mooncake_transfer_engine*.dist-info directories (need exactly one to check the version); {SETUP_HINT}",
            dir.display(),
            found.len()
        );
    };
    let text = fs::read_to_string(metadata).unwrap_or_else(|e| panic!("cannot read {}: {e}", metadata.display()));
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
    let (Some(name), Some(version)) = (field("Name: "), field("Version: ")) else {
        panic!("{} lacks Name: or Version:", metadata.display());
    };
    (name, version, metadata.clone())
}

fn wheel(dir: &Path) {
    let dir = dir.canonicalize().unwrap();
    let engine = dir.join("mooncake").join("engine.so");
    let (name, version, metadata) = wheel_metadata(&dir);
    println!("cargo:rerun-if-changed={}", engine.display());
    println!("cargo:rerun-if-changed={}", metadata.display());
    if find_verified(&name, &version).is_none() {
        let known: Vec<String> = VERIFIED_RELEASES.iter().map(|r| format!("{}=={}", r.dist, r.version)).collect();
        panic!(
            "refusing Mooncake wheel {name}=={version} in {}: its ABI layout is not verified (a mismatch corrupts transfers silently). \
             Verified: {}. {SETUP_HINT}",
            dir.display(),
            known.join(", ")
        );
    }

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let cpp = Path::new("cpp");
    // The C API over engine.so's C++ class. The Python stand-ins go in a
    // second archive after it; the shim references their anchor, so the
    // linker keeps them and exports them to engine.so.
    cc::Build::new().cpp(true).std("c++17").file(cpp.join("shim.cpp")).include(cpp).warnings(true).compile("kvc_mooncake_shim");
    cc::Build::new().file(cpp.join("python_stubs.c")).std("c11").compile("kvc_mooncake_pystubs");

    // engine.so has no SONAME, so a binary records the name it was linked
    // by. Link it through a one-line linker script naming its absolute path:
    // every binary of every dependent crate then loads it from there, with
    // no rpath or LD_LIBRARY_PATH (engine.so's own RPATH finds the wheel's
    // bundled libraries).
    fs::write(out.join("libkvc_mooncake_engine.so"), format!("INPUT({})\n", engine.display())).unwrap();
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=dylib=kvc_mooncake_engine");
    println!("cargo:rustc-cfg=mooncake=\"wheel\"");
    println!("cargo:rustc-env=KVC_MOONCAKE_LINKAGE=wheel {name}=={version} ({})", dir.display());
    println!("cargo:mode=wheel");

    match build_alone_bench(&out, &engine) {
        Ok(path) => println!("cargo:alone_bench={}", path.display()),
        Err(e) => println!("cargo:warning=mooncake-sys: the Mooncake-alone benchmark driver did not build ({e}); kvc-transfer-bench will run without its baseline"),
    }
}

/// `cpp/mooncake_alone_bench.cpp` linked against the same shim archives and
/// the same engine.so: the "Mooncake alone" baseline of kvc-transfer-bench.
fn build_alone_bench(out: &Path, engine: &Path) -> Result<PathBuf, String> {
    let exe = out.join("mooncake_alone_bench");
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let mut cmd = Command::new(compiler.path());
    cmd.args(["-O2", "-std=c++17", "-Icpp", "cpp/mooncake_alone_bench.cpp", "-o"])
        .arg(&exe)
        .arg(format!("-L{}", out.display()))
        .args(["-lkvc_mooncake_shim", "-lkvc_mooncake_pystubs"])
        .arg(engine)
        .arg("-pthread");
    let result = cmd.output().map_err(|e| format!("{}: {e}", compiler.path().display()))?;
    if !result.status.success() {
        return Err(String::from_utf8_lossy(&result.stderr).lines().take(5).collect::<Vec<_>>().join(" | "));
    }
    Ok(exe)
}

fn source(root: &Path) {
    let lib = ["lib", "lib64"].iter().map(|d| root.join(d)).find(|d| d.join("libtransfer_engine.so").is_file()).unwrap_or_else(|| {
        panic!(
            "MOONCAKE_ROOT={} has no lib/libtransfer_engine.so (or lib64/); build Mooncake from source with its C API \
             (cmake -DBUILD_SHARED_LIBS=ON && make install) or unset MOONCAKE_ROOT and {SETUP_HINT}",
            root.display()
        )
    });
    println!("cargo:rerun-if-changed={}", lib.join("libtransfer_engine.so").display());
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=transfer_engine");
    // Only this crate's own targets get the rpath from here; dependents add
    // it from DEP_MOONCAKE_RPATH (crates/disagg/build.rs does).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rpath={}", lib.display());
    println!("cargo:rustc-cfg=mooncake=\"source\"");
    println!("cargo:rustc-env=KVC_MOONCAKE_LINKAGE=source libtransfer_engine ({})", lib.display());
    println!("cargo:mode=source");
}
