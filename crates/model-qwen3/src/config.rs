//! Hugging Face `config.json` for Qwen3 and Qwen3-MoE, in both spellings:
//! the hub's (transformers 4.x: `rope_theta`, `num_experts`, `torch_dtype`)
//! and transformers 5's (`rope_parameters.rope_theta`, `num_local_experts`,
//! `dtype`).

use serde::Deserialize;
use serde_json::Value;

use crate::ModelError;

/// config.json of Qwen/Qwen3-30B-A3B (the fields kvc reads): the shape the
/// GPU benchmark (kvc-bench) and GPU tests run with dummy weights
/// (scripts/make_model_dir.sh writes the same, with a longer context).
pub const QWEN3_30B_A3B: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
  "moe_intermediate_size": 768, "num_hidden_layers": 48,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645
}"#;

#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub norm_topk_prob: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// The checkpoint's dtype ("float32", "bfloat16", "float16"), if stated.
    pub dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Present for Qwen3-MoE.
    pub moe: Option<MoeConfig>,
}

/// Raw file, every spelling optional; [`Qwen3Config::from_json`] resolves it.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    norm_topk_prob: Option<bool>,
    /// A quantized checkpoint's description (transformers'
    /// `quantization_config`, compressed-tensors' `compression_config`):
    /// kvc implements none, so any is refused.
    quantization_config: Option<Value>,
    compression_config: Option<Value>,
}

fn token_ids(v: &Option<Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        _ => Vec::new(),
    }
}

/// Accepts no scaling, or an explicit "default" rope type; anything else
/// (yarn, linear, dynamic, ...) is not implemented and must not be silently
/// ignored, because it changes every logit past the original context.
fn check_rope_type(v: &Value, key: &str) -> Result<(), ModelError> {
    if v.is_null() {
        return Ok(());
    }
    let ty = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
    if ty == "default" {
        Ok(())
    } else {
        Err(ModelError::Config(format!("unsupported {key}: rope_type \"{ty}\" ({v}); kvc implements only default RoPE")))
    }
}

impl Qwen3Config {
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        let is_moe_arch = raw.architectures.iter().any(|a| a == "Qwen3MoeForCausalLM") || raw.model_type.as_deref() == Some("qwen3_moe");
        let is_dense_arch = raw.architectures.iter().any(|a| a == "Qwen3ForCausalLM") || raw.model_type.as_deref() == Some("qwen3");
        if !is_moe_arch && !is_dense_arch {
            return Err(ModelError::Config(format!(
                "unsupported model: architectures {:?}, model_type {:?}; kvc serves Qwen3ForCausalLM and Qwen3MoeForCausalLM",
                raw.architectures, raw.model_type
            )));
        }
        for (key, q) in [("quantization_config", &raw.quantization_config), ("compression_config", &raw.compression_config)] {
            if let Some(q) = q.as_ref().filter(|q| !q.is_null()) {
                let method = q.get("quant_method").or_else(|| q.get("format")).and_then(|m| m.as_str()).unwrap_or("unknown");
                return Err(ModelError::Config(format!(
                    "a quantized checkpoint ({key} with quant_method \"{method}\"): kvc loads only unquantized f32 / bf16 / f16 \
                     weights, and would answer wrongly with these (their scales would be ignored)"
                )));
            }
        }
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(ModelError::Config(format!("unsupported hidden_act {act:?} (only silu)")));
            }
        }
        if raw.use_sliding_window == Some(true) {
            return Err(ModelError::Config("use_sliding_window=true is not supported".into()));
        }
        if let Some(s) = &raw.rope_scaling {
            check_rope_type(s, "rope_scaling")?;
        }
        let mut rope_theta = raw.rope_theta;
        if let Some(p) = &raw.rope_parameters {
            check_rope_type(p, "rope_parameters")?;
            if let Some(t) = p.get("rope_theta").and_then(|t| t.as_f64()) {
                rope_theta = Some(t);
            }
        }
        let heads = raw.num_attention_heads;
        if heads == 0 || raw.hidden_size == 0 || raw.num_hidden_layers == 0 || raw.vocab_size == 0 {
            return Err(ModelError::Config("zero-sized dimension in config.json".into()));
        }
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(ModelError::Config(format!(
                "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        if head_dim % 2 != 0 {
            return Err(ModelError::Config(format!("head_dim must be even, got {head_dim}")));
        }
        let num_experts = raw.num_experts.or(raw.num_local_experts).unwrap_or(0);
        let moe = if is_moe_arch && num_experts > 0 {
            let k = raw.num_experts_per_tok.unwrap_or(8);
            if k == 0 || k > num_experts {
                return Err(ModelError::Config(format!("num_experts_per_tok {k} must be in 1..={num_experts}")));
            }
            Some(MoeConfig {
                num_experts,
                num_experts_per_tok: k,
                moe_intermediate_size: raw
                    .moe_intermediate_size
                    .ok_or_else(|| ModelError::Config("moe_intermediate_size missing".into()))?,
                decoder_sparse_step: raw.decoder_sparse_step.unwrap_or(1).max(1),
                mlp_only_layers: raw.mlp_only_layers.unwrap_or_default(),
                norm_topk_prob: raw.norm_topk_prob.unwrap_or(false),
            })
        } else {
            None
        };
        let intermediate_size = match (raw.intermediate_size, &moe) {
            (Some(i), _) => i,
            (None, Some(m)) => m.moe_intermediate_size,
            (None, None) => return Err(ModelError::Config("intermediate_size missing".into())),
        };
        Ok(Self {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(32768),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(false),
            dtype: raw.dtype.or(raw.torch_dtype),
            bos_token_id: token_ids(&raw.bos_token_id).first().copied(),
            eos_token_ids: token_ids(&raw.eos_token_id),
            moe,
        })
    }

    /// HF's rule: a layer is sparse unless listed in `mlp_only_layers`, and
    /// only every `decoder_sparse_step`-th layer (1-based) is.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        match &self.moe {
            Some(m) => !m.mlp_only_layers.contains(&layer) && (layer + 1) % m.decoder_sparse_step == 0,
            None => false,
        }
    }

    /// Parameters of the model (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let attn = h * self.head_dim * (self.num_attention_heads * 2 + self.num_key_value_heads * 2) + 2 * self.head_dim;
        let mut total = self.vocab_size * h * if self.tie_word_embeddings { 1 } else { 2 } + h;
        for l in 0..self.num_hidden_layers {
            total += attn + 2 * h;
            total += match &self.moe {
                Some(m) if self.is_moe_layer(l) => m.num_experts * (3 * h * m.moe_intermediate_size + h),
                _ => 3 * h * self.intermediate_size,
            };
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUB: &str = r#"{"architectures":["Qwen3MoeForCausalLM"],"model_type":"qwen3_moe","vocab_size":10,
      "hidden_size":8,"intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,
      "rope_theta":1000000.0,"rope_scaling":null,"torch_dtype":"bfloat16","num_experts":4,"num_experts_per_tok":2,
      "moe_intermediate_size":4,"norm_topk_prob":true,"eos_token_id":[3,4]}"#;

    #[test]
    fn hub_and_transformers5_spellings_give_the_same_config() {
        let v5 = HUB
            .replace(r#""rope_theta":1000000.0,"rope_scaling":null"#, r#""rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"}"#)
            .replace("torch_dtype", "dtype")
            .replace("num_experts\"", "num_local_experts\"");
        assert_ne!(v5, HUB);
        assert_eq!(Qwen3Config::from_json(HUB).unwrap(), Qwen3Config::from_json(&v5).unwrap());
        let c = Qwen3Config::from_json(HUB).unwrap();
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.head_dim, 4);
        assert_eq!(c.eos_token_ids, vec![3, 4]);
        assert_eq!(c.moe.as_ref().unwrap().num_experts, 4);
    }

    #[test]
    fn a_quantized_checkpoint_is_refused_by_name() {
        let fp8 = HUB.replace(
            r#""rope_scaling":null"#,
            r#""rope_scaling":null,"quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[128,128]}"#,
        );
        let err = Qwen3Config::from_json(&fp8).unwrap_err().to_string();
        assert!(err.contains("quantization_config") && err.contains("\"fp8\""), "{err}");
        let ct = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":null,"compression_config":{"format":"pack-quantized"}"#);
        assert!(Qwen3Config::from_json(&ct).unwrap_err().to_string().contains("pack-quantized"));
        let none = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":null,"quantization_config":null"#);
        assert!(Qwen3Config::from_json(&none).is_ok());
    }

    #[test]
    fn unsupported_rope_scaling_is_a_clear_error() {
        let yarn = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":{"rope_type":"yarn","factor":4.0}"#);
        let err = Qwen3Config::from_json(&yarn).unwrap_err().to_string();
        assert!(err.contains("yarn"), "{err}");
    }

    #[test]
    fn sparse_layer_rule_follows_hf() {
        let c = HUB
            .replace(r#""norm_topk_prob":true"#, r#""norm_topk_prob":true,"decoder_sparse_step":2,"mlp_only_layers":[3]"#)
            .replace(r#""num_hidden_layers":2"#, r#""num_hidden_layers":6"#);
        let c = Qwen3Config::from_json(&c).unwrap();
        let sparse: Vec<usize> = (0..6).filter(|&l| c.is_moe_layer(l)).collect();
        assert_eq!(sparse, vec![1, 5]);
    }

    #[test]
    fn other_architectures_are_refused() {
        let llama = HUB.replace("Qwen3MoeForCausalLM", "LlamaForCausalLM").replace("qwen3_moe", "llama");
        assert!(Qwen3Config::from_json(&llama).is_err());
    }
}
