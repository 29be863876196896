//! `system_fingerprint`: which backend answered, as OpenAI means it ("with
//! `seed`, to understand when backend changes have been made that might
//! impact determinism"). "fp_" and 12 hex digits of a SHA-256 over the
//! running executable (the build: kvc's code, its dependencies and the
//! compiler), the model (where its weights came from, its config and
//! weight files, the load format, dtype and dummy-weight seed) and the
//! device (with the CPU's vector extensions, which choose the matrix
//! kernels). No build step is involved: the executable is read once per
//! process at load.

use std::path::Path;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// SHA-256 of the running executable, or of its version alone where it
/// cannot be read.
fn build_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let exe = std::env::current_exe().and_then(|p| {
            let mut f = std::fs::File::open(p)?;
            let mut h = Sha256::new();
            std::io::copy(&mut f, &mut h)?;
            Ok(hex(&h.finalize()))
        });
        match exe {
            Ok(digest) => digest,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the executable: system_fingerprint covers kvc's version, not its build");
                format!("kvc {}", env!("CARGO_PKG_VERSION"))
            }
        }
    })
}

/// What identifies a checkpoint directory: its path (a hub snapshot's
/// names the commit), config.json, and each weight file's name and size.
pub(crate) fn checkpoint_identity(dir: &Path) -> String {
    format!("dir={}\n{}", dir.display(), checkpoint_content(dir))
}

/// A checkpoint's config.json and each weight file's name and size,
/// wherever the directory is.
fn checkpoint_content(dir: &Path) -> String {
    let mut id = String::new();
    if let Ok(config) = std::fs::read_to_string(dir.join("config.json")) {
        id.push_str(&config);
    }
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".safetensors").then(|| Some((name, std::fs::metadata(e.path()).ok()?.len())))?
        })
        .collect();
    files.sort();
    for (name, len) in files {
        id.push_str(&format!("\n{name} {len}"));
    }
    id
}

/// The fingerprint of this build serving `model` (a description of the
/// weights and how they are loaded) on `device`.
pub(crate) fn system_fingerprint(model: &str, device: &str) -> String {
    let mut h = Sha256::new();
    for part in [build_id(), model, device, &cpu_features()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("fp_{}", &hex(&h.finalize())[..12])
}

/// What computes a model's KV, for the P/D handshake: "w_" and 12 hex
/// digits of a SHA-256 over `weights` (checkpoint or dummy seed, compute
/// dtype, quantization at load) and the checkpoint's content (config.json,
/// weight files' names and sizes), not its path, the build or the device:
/// two workers serving one model from different directories or GPUs agree,
/// a worker that quantizes it at load does not.
pub(crate) fn weights_identity(weights: &str, checkpoint: Option<&Path>) -> String {
    let mut h = Sha256::new();
    h.update(weights.as_bytes());
    h.update([0]);
    h.update(checkpoint.map(checkpoint_content).unwrap_or_default().as_bytes());
    format!("w_{}", &hex(&h.finalize())[..12])
}

fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let f = [
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
        ];
        f.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect::<Vec<_>>().join(",")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_is_stable_and_changes_with_the_model_or_device() {
        let a = system_fingerprint("embedded seed=0 dtype=F32", "Cpu");
        assert!(a.starts_with("fp_") && a.len() == 15 && a[3..].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_eq!(a, system_fingerprint("embedded seed=0 dtype=F32", "Cpu"));
        assert_ne!(a, system_fingerprint("embedded seed=1 dtype=F32", "Cpu"));
        assert_ne!(a, system_fingerprint("embedded seed=0 dtype=F32", "Cuda(0)"));
    }

    #[test]
    fn the_weights_identity_follows_the_checkpoints_content_not_its_place() {
        let base = std::env::temp_dir().join(format!("kvc-weights-id-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("elsewhere"));
        for d in [&a, &b] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("config.json"), "{\"hidden_size\": 8}").unwrap();
            std::fs::write(d.join("model.safetensors"), [0u8; 64]).unwrap();
        }
        let id = weights_identity("checkpoint dtype BF16", Some(&a));
        assert!(id.starts_with("w_") && id.len() == 14, "{id}");
        assert_eq!(id, weights_identity("checkpoint dtype BF16", Some(&b)), "the same files in another directory");
        assert_ne!(id, weights_identity("checkpoint quantization Fp8 dtype BF16", Some(&a)), "quantized at load");
        assert_ne!(id, weights_identity("checkpoint dtype F32", Some(&a)), "another compute dtype");
        std::fs::write(b.join("model.safetensors"), [0u8; 65]).unwrap();
        assert_ne!(id, weights_identity("checkpoint dtype BF16", Some(&b)), "other weight files");
        std::fs::remove_dir_all(&base).ok();
    }
}
