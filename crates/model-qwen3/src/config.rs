//! Hugging Face `config.json` for Qwen3 and Qwen3-MoE, in both spellings:
//! the hub's (transformers 4.x: `rope_theta`, `num_experts`, `torch_dtype`)
//! and transformers 5's (`rope_parameters.rope_theta`, `num_local_experts`,
//! `dtype`).

use serde::Deserialize;
use serde_json::Value;

use crate::rope::RopeScaling;
use crate::ModelError;

/// config.json of Qwen/Qwen3-30B-A3B (the fields kvc reads): the shape the
/// GPU benchmark (kvc-bench) and GPU tests run with dummy weights
/// (scripts/make_model_dir.sh writes the same, with YaRN for a longer context).
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
    /// RoPE's long-context scaling (`rope_scaling` / `rope_parameters`).
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// The checkpoint's dtype ("float32", "bfloat16", "float16"), if stated.
    pub dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Present for Qwen3-MoE.
    pub moe: Option<MoeConfig>,
    /// A block-FP8 checkpoint's `quantization_config` (fp8.rs).
    pub fp8: Option<crate::fp8::BlockFp8>,
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
    /// kvc implements block FP8 (fp8.rs); any other is refused.
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

/// Reads a `rope_scaling` / `rope_parameters` object as transformers 5
/// does: `default`, `linear` and `yarn` (its defaults: beta_fast 32,
/// beta_slow 1, truncate true, original window = `max_position_embeddings`,
/// attention factor from `factor` and `mscale`/`mscale_all_dim`), and
/// `dynamic` (NTK) as vLLM serves it: one table at `max_position_embeddings`
/// x `factor` ([`RopeScaling::DynamicNtk`]; transformers recomputes it per
/// batch length). Any other type (`llama3`, `longrope`, ...) and any key
/// kvc would not read is refused by name: each changes every logit past
/// the original context.
fn parse_rope(v: &Value, key: &str, max_position_embeddings: usize) -> Result<RopeScaling, ModelError> {
    let Some(obj) = v.as_object() else {
        return if v.is_null() { Ok(RopeScaling::None) } else { Err(ModelError::Config(format!("{key} must be an object, got {v}"))) };
    };
    let bad = |what: String| ModelError::Config(format!("unsupported {key}: {what} ({v})"));
    let ty = obj.get("rope_type").or_else(|| obj.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
    let known: &[&str] = match ty {
        "default" => &[],
        "linear" | "dynamic" => &["factor"],
        "yarn" => &[
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ],
        other => return Err(bad(format!("rope_type \"{other}\"; kvc implements default, linear, yarn and dynamic"))),
    };
    for (k, val) in obj {
        let common = matches!(k.as_str(), "rope_type" | "type" | "rope_theta");
        let full_rotary = k == "partial_rotary_factor" && val.as_f64() == Some(1.0);
        if !(common || full_rotary || known.contains(&k.as_str()) || val.is_null()) {
            return Err(bad(format!("key \"{k}\" is not implemented for rope_type \"{ty}\"")));
        }
    }
    let num = |k: &str| obj.get(k).filter(|x| !x.is_null()).map(|x| x.as_f64().ok_or_else(|| bad(format!("{k} must be a number"))));
    let factor = || -> Result<f64, ModelError> {
        match num("factor").transpose()? {
            Some(f) if f >= 1.0 => Ok(f),
            Some(f) => Err(bad(format!("factor {f} must be at least 1"))),
            None => Err(bad("factor is required".into())),
        }
    };
    Ok(match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::DynamicNtk { factor: factor()?, window: max_position_embeddings },
        _ => {
            let factor = factor()?;
            let window = match num("original_max_position_embeddings").transpose()? {
                Some(w) if w >= 1.0 && w.fract() == 0.0 => w as usize,
                Some(w) => return Err(bad(format!("original_max_position_embeddings {w} must be a positive integer"))),
                None => max_position_embeddings,
            };
            let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attention_factor =
                match (num("attention_factor").transpose()?, num("mscale").transpose()?, num("mscale_all_dim").transpose()?) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(factor, m) / mscale(factor, all),
                    _ => mscale(factor, 1.0),
                };
            let truncate = match obj.get("truncate") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(bad("truncate must be a boolean".into())),
            };
            // transformers: `rope_parameters.get("beta_fast") or 32` (0 means the default too).
            let beta = |k: &str, d: f64| num(k).transpose().map(|b| b.filter(|b| *b != 0.0).unwrap_or(d));
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: window,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                attention_factor,
                truncate,
            }
        }
    })
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
        let mut fp8 = None;
        for (key, q) in [("quantization_config", &raw.quantization_config), ("compression_config", &raw.compression_config)] {
            if let Some(q) = q.as_ref().filter(|q| !q.is_null()) {
                let method = q.get("quant_method").or_else(|| q.get("format")).and_then(|m| m.as_str()).unwrap_or("unknown");
                if key == "quantization_config" && method == "fp8" {
                    fp8 = Some(crate::fp8::BlockFp8::from_config(q)?);
                    continue;
                }
                return Err(ModelError::Config(format!(
                    "a quantized checkpoint ({key} with quant_method \"{method}\"): kvc loads unquantized f32 / bf16 / f16 \
                     weights and block-FP8 ones (quant_method \"fp8\"), and would answer wrongly with these (their scales \
                     would be ignored)"
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
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(32768);
        let mut rope_scaling = match &raw.rope_scaling {
            Some(s) => parse_rope(s, "rope_scaling", max_position_embeddings)?,
            None => RopeScaling::None,
        };
        let mut rope_theta = raw.rope_theta;
        if let Some(p) = &raw.rope_parameters {
            let from_parameters = parse_rope(p, "rope_parameters", max_position_embeddings)?;
            if from_parameters != RopeScaling::None {
                if rope_scaling != RopeScaling::None && rope_scaling != from_parameters {
                    return Err(ModelError::Config(format!(
                        "rope_scaling and rope_parameters disagree ({} and {}); kvc will not guess",
                        rope_scaling.name(),
                        from_parameters.name()
                    )));
                }
                rope_scaling = from_parameters;
            }
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
            max_position_embeddings,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0),
            rope_scaling,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(false),
            dtype: raw.dtype.or(raw.torch_dtype),
            bos_token_id: token_ids(&raw.bos_token_id).first().copied(),
            eos_token_ids: token_ids(&raw.eos_token_id),
            moe,
            fp8,
        })
    }

    /// The longest context the model serves, as vLLM derives it: with YaRN
    /// the original window times the factor (Qwen3's documented
    /// `{"factor": 4, "original_max_position_embeddings": 32768}` serves
    /// 131,072 tokens beside `max_position_embeddings` 40,960), with linear
    /// or dynamic NTK scaling `max_position_embeddings` times the factor, else
    /// `max_position_embeddings`.
    pub fn context_window(&self) -> usize {
        let scaled = match &self.rope_scaling {
            RopeScaling::None => return self.max_position_embeddings,
            RopeScaling::Linear { factor } => self.max_position_embeddings as f64 * factor,
            RopeScaling::DynamicNtk { factor, window } => *window as f64 * factor,
            RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => *original_max_position_embeddings as f64 * factor,
        };
        (scaled as usize).max(self.max_position_embeddings)
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
    fn a_quantized_checkpoint_is_refused_by_name_unless_block_fp8() {
        let fp8 = HUB.replace(
            r#""rope_scaling":null"#,
            r#""rope_scaling":null,"quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[128,128]}"#,
        );
        assert_eq!(Qwen3Config::from_json(&fp8).unwrap().fp8.map(|f| f.block), Some((128, 128)));
        let gptq = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":null,"quantization_config":{"quant_method":"gptq","bits":4}"#);
        let err = Qwen3Config::from_json(&gptq).unwrap_err().to_string();
        assert!(err.contains("quantization_config") && err.contains("\"gptq\""), "{err}");
        let ct = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":null,"compression_config":{"format":"pack-quantized"}"#);
        assert!(Qwen3Config::from_json(&ct).unwrap_err().to_string().contains("pack-quantized"));
        let none = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":null,"quantization_config":null"#);
        assert!(Qwen3Config::from_json(&none).is_ok());
    }

    #[test]
    fn unsupported_rope_scaling_is_a_clear_error() {
        let with = |scaling: &str| HUB.replace(r#""rope_scaling":null"#, &format!(r#""rope_scaling":{scaling}"#));
        for (scaling, names) in [
            (r#"{"rope_type":"dynamic","factor":2.0,"original_max_position_embeddings":4096}"#, "original_max_position_embeddings"),
            (r#"{"rope_type":"dynamic","alpha":2.0}"#, "alpha"),
            (r#"{"rope_type":"llama3","factor":8.0}"#, "llama3"),
            (r#"{"rope_type":"yarn","factor":4.0,"low_freq_factor":1}"#, "low_freq_factor"),
            (r#"{"rope_type":"yarn"}"#, "factor is required"),
            (r#"{"rope_type":"linear","factor":0.5}"#, "at least 1"),
            (r#"{"rope_type":"yarn","factor":4.0,"partial_rotary_factor":0.5}"#, "partial_rotary_factor"),
        ] {
            let err = Qwen3Config::from_json(&with(scaling)).unwrap_err().to_string();
            assert!(err.contains(names) && err.contains("rope_scaling"), "{scaling}: {err}");
        }
    }

    /// The 2507 and Coder checkpoints' config.json shape (262,144 native
    /// positions, rope_theta 1e7, no scaling) loads as it ships.
    #[test]
    fn the_2507_and_coder_configs_load_unchanged() {
        let coder = r#"{"architectures":["Qwen3MoeForCausalLM"],"model_type":"qwen3_moe","vocab_size":151936,
          "hidden_size":2048,"intermediate_size":5472,"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,
          "head_dim":128,"max_position_embeddings":262144,"rope_theta":10000000,"rope_scaling":null,"rms_norm_eps":1e-06,
          "torch_dtype":"bfloat16","num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true,
          "decoder_sparse_step":1,"mlp_only_layers":[],"use_sliding_window":false,"sliding_window":null,"max_window_layers":48,
          "tie_word_embeddings":false,"bos_token_id":151643,"eos_token_id":151645,"hidden_act":"silu","attention_bias":false,
          "attention_dropout":0.0,"initializer_range":0.02,"output_router_logits":false,"router_aux_loss_coef":0.0,
          "use_cache":true,"transformers_version":"4.51.0"}"#;
        let c = Qwen3Config::from_json(coder).unwrap();
        assert_eq!((c.max_position_embeddings, c.rope_theta, c.context_window()), (262144, 1e7, 262144));
        assert_eq!(c.rope_scaling, RopeScaling::None);
    }

    /// Qwen3's documented YaRN config, in both spellings, with transformers'
    /// defaults filled in (the attention factor 0.1 ln(4) + 1).
    #[test]
    fn yarn_reads_as_transformers_does_in_both_spellings() {
        let yarn = r#""rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768"#;
        let v4 = HUB.replace(r#""rope_scaling":null"#, &format!(r#""rope_scaling":{{{yarn}}}"#));
        let v5 = HUB
            .replace(r#""rope_theta":1000000.0,"rope_scaling":null"#, &format!(r#""rope_parameters":{{"rope_theta":1000000.0,{yarn}}}"#));
        let (a, b) = (Qwen3Config::from_json(&v4).unwrap(), Qwen3Config::from_json(&v5).unwrap());
        assert_eq!(a, b);
        let RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, attention_factor, truncate } =
            a.rope_scaling
        else {
            panic!("{:?}", a.rope_scaling)
        };
        assert_eq!((factor, original_max_position_embeddings, beta_fast, beta_slow, truncate), (4.0, 32768, 32.0, 1.0, true));
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        // No original window: the config's max_position_embeddings.
        let bare = HUB.replace(r#""rope_scaling":null"#, r#""max_position_embeddings":4096,"rope_scaling":{"type":"yarn","factor":2.0}"#);
        assert!(matches!(
            Qwen3Config::from_json(&bare).unwrap().rope_scaling,
            RopeScaling::Yarn { original_max_position_embeddings: 4096, .. }
        ));
        assert_eq!(a.context_window(), 131072);
        let linear = HUB.replace(r#""rope_scaling":null"#, r#""rope_scaling":{"rope_type":"linear","factor":2.0}"#);
        assert_eq!(Qwen3Config::from_json(&linear).unwrap().rope_scaling, RopeScaling::Linear { factor: 2.0 });
        let both = v5.replace(r#""rope_parameters""#, r#""rope_scaling":{"rope_type":"linear","factor":2.0},"rope_parameters""#);
        let err = Qwen3Config::from_json(&both).unwrap_err().to_string();
        assert!(err.contains("disagree"), "{err}");
    }

    #[test]
    fn dynamic_ntk_serves_the_window_times_the_factor_as_vllm_does() {
        let dynamic =
            HUB.replace(r#""rope_scaling":null"#, r#""max_position_embeddings":4096,"rope_scaling":{"rope_type":"dynamic","factor":2.0}"#);
        let c = Qwen3Config::from_json(&dynamic).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::DynamicNtk { factor: 2.0, window: 4096 });
        assert_eq!(c.context_window(), 8192);
        // vLLM's base at window x factor: theta * (factor^2 - factor + 1)^(d / (d - 2)).
        let d = c.head_dim as f64;
        let base = c.rope_theta * 3f64.powf(d / (d - 2.0));
        let rope = crate::rope::Rope::new(c.head_dim, c.rope_theta, &c.rope_scaling);
        for (i, f) in rope.inv_freq().iter().enumerate() {
            let want = base.powf(-(2.0 * i as f64) / d);
            assert!(((*f as f64) - want).abs() <= want * 1e-5, "{i}: {f} vs {want}");
        }
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
