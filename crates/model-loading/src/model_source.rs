//! Where a model comes from ([`ModelSource`]: the embedded model, a local
//! directory, or a hub id) and how its weights are obtained
//! ([`LoadFormat`]), resolved into the checkpoint directory, the name it
//! is served under by default and its `config.json` ([`resolve`]). The
//! engine reads the weights, tokenizer and template from there.

use std::path::PathBuf;

use crate::hub::{HubEnv, HubOptions};
use crate::LoadError;

/// Where the model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The small built-in Qwen3-MoE with dummy weights and the real Qwen3
    /// tokenizer; needs no files.
    Embedded,
    /// A local directory holding `config.json`, safetensors and tokenizer files.
    Path(PathBuf),
    /// A Hugging Face hub id: taken from the hub cache, downloaded into it
    /// first when missing ([`crate::hub`]).
    HubId(String),
}

impl ModelSource {
    /// `None` or an empty string -> embedded; an existing directory -> path;
    /// otherwise a hub id.
    pub fn parse(model: Option<&str>) -> Self {
        match model {
            None | Some("") => ModelSource::Embedded,
            Some(m) if std::path::Path::new(m).exists() => ModelSource::Path(PathBuf::from(m)),
            Some(m) => ModelSource::HubId(m.to_string()),
        }
    }
}

/// How to obtain weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// Read safetensors.
    #[default]
    Auto,
    /// Random weights from a fixed seed, for any config.
    Dummy,
}

/// Name served for the embedded model.
pub const EMBEDDED_MODEL_NAME: &str = "kvc-default";

/// The built-in model: a small Qwen3-MoE (8 experts, top-2) with the real
/// Qwen3 vocabulary, filled with dummy weights. Quick on two CPU cores.
pub const EMBEDDED_CONFIG: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe",
  "vocab_size": 151936,
  "hidden_size": 128,
  "intermediate_size": 512,
  "moe_intermediate_size": 128,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 32,
  "num_experts": 8,
  "num_experts_per_tok": 2,
  "norm_topk_prob": true,
  "decoder_sparse_step": 1,
  "mlp_only_layers": [],
  "max_position_embeddings": 32768,
  "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "float32",
  "bos_token_id": 151643,
  "eos_token_id": 151645
}"#;

/// A source resolved: the checkpoint directory (None: the embedded
/// model), the name served by default, and the `config.json` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSource {
    pub dir: Option<PathBuf>,
    pub served_default: String,
    pub config_json: String,
}

/// Resolves `source`: a hub id from the hub cache, downloaded first when
/// missing ([`crate::hub::resolve`] with `hub`; offline with
/// `HF_HUB_OFFLINE`; the weights only with [`LoadFormat::Auto`]).
pub fn resolve(source: &ModelSource, format: LoadFormat, hub: HubSettings) -> Result<ResolvedSource, LoadError> {
    let (dir, served_default) = match source {
        ModelSource::Embedded => (None, EMBEDDED_MODEL_NAME.to_string()),
        ModelSource::Path(p) => (Some(p.clone()), p.display().to_string()),
        ModelSource::HubId(id) => {
            let options = HubOptions { revision: hub.revision, cache_dir: hub.cache_dir, weights: format == LoadFormat::Auto };
            (Some(crate::hub::resolve(id, &options, &HubEnv::from_env())?), id.clone())
        }
    };
    let config_json = match &dir {
        None => EMBEDDED_CONFIG.to_string(),
        Some(d) => {
            let p = d.join("config.json");
            std::fs::read_to_string(&p).map_err(|e| LoadError::Read(format!("{}: {e}", p.display())))?
        }
    };
    Ok(ResolvedSource { dir, served_default, config_json })
}

/// The hub settings a hub id is resolved with (`--revision`,
/// `--download-dir`).
#[derive(Debug, Clone, Default)]
pub struct HubSettings {
    pub revision: Option<String>,
    pub cache_dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_picks_embedded_path_or_hub_id() {
        assert_eq!(ModelSource::parse(None), ModelSource::Embedded);
        assert_eq!(ModelSource::parse(Some("")), ModelSource::Embedded);
        let dir = std::env::temp_dir();
        assert_eq!(ModelSource::parse(dir.to_str()), ModelSource::Path(dir.clone()));
        assert_eq!(ModelSource::parse(Some("Qwen/Qwen3-0.6B-no-such-dir")), ModelSource::HubId("Qwen/Qwen3-0.6B-no-such-dir".into()));
    }

    #[test]
    fn a_directory_without_config_json_is_a_read_error_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("kvc-model-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = resolve(&ModelSource::Path(dir.clone()), LoadFormat::Auto, HubSettings::default()).unwrap_err();
        assert!(matches!(&e, LoadError::Read(m) if m.contains("config.json")), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_embedded_model_resolves_to_its_config() {
        let r = resolve(&ModelSource::Embedded, LoadFormat::Auto, HubSettings::default()).unwrap();
        assert_eq!(r.dir, None);
        assert_eq!(r.served_default, EMBEDDED_MODEL_NAME);
        let v: serde_json::Value = serde_json::from_str(&r.config_json).unwrap();
        assert_eq!(v["model_type"], "qwen3_moe");
    }
}
