//! A tiny block-FP8 Qwen3-MoE made by the tests themselves, with the shapes
//! CUTLASS's FP8 GEMMs take (hidden 256, head dim 128: q 512, k and v 256
//! rows; dense intermediate 384, expert intermediate 256; every K a
//! multiple of 128): layer 0 a dense MLP, layer 1 eight experts (top 2).
//! Weights are drawn from a seeded generator, the decoder layers'
//! projections quantized here on the host as transformers'
//! `FineGrainedFP8Config` does (per 128x128 block: scale = amax / 448, q =
//! e4m3(w / scale), the scale stored as `weight_scale_inv`); embeddings,
//! norms, router and LM head stay bf16, as in Qwen's FP8 checkpoints.
//! Beside it, its twin: the same weights dequantized on the host (q x
//! scale, f32 loops) as a plain f32 checkpoint.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};

pub const TINY_VOCAB: usize = 384;
const HIDDEN: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 128;
const INTERMEDIATE: usize = 384;
const MOE_INTERMEDIATE: usize = 256;
const EXPERTS: usize = 8;
const BLOCK: usize = 128;
const E4M3_MAX: f32 = 448.0;

/// The two checkpoint directories (removed on drop).
pub struct TinyFp8 {
    pub fp8: PathBuf,
    pub dequantized: PathBuf,
    base: PathBuf,
}

impl Drop for TinyFp8 {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.base).ok();
    }
}

fn config(fp8: bool) -> serde_json::Value {
    let mut c = serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": TINY_VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "moe_intermediate_size": MOE_INTERMEDIATE, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "num_experts": EXPERTS, "num_experts_per_tok": 2, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
        "torch_dtype": if fp8 { "bfloat16" } else { "float32" }, "bos_token_id": 1, "eos_token_id": 2
    });
    if fp8 {
        c["quantization_config"] = serde_json::json!({
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]
        });
    }
    c
}

/// `[n, k]` uniform with standard deviation `std`, rounded to bf16.
fn draw(rng: &mut rand::rngs::StdRng, n: usize, k: usize, std: f32) -> Tensor {
    let a = std * 3f32.sqrt();
    let v: Vec<f32> = (0..n * k).map(|_| rng.random_range(-a..a)).collect();
    Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap()
}

/// (e4m3 weight, its scales `[ceil(n / 128), ceil(k / 128)]`, the host's
/// dequantized f32 weight).
fn quantize(w: &Tensor) -> (Tensor, Tensor, Tensor) {
    let (n, k) = w.dims2().unwrap();
    let v = w.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
    let (sr, sc) = (n.div_ceil(BLOCK), k.div_ceil(BLOCK));
    let mut scale = vec![vec![1f32; sc]; sr];
    for (bi, row) in scale.iter_mut().enumerate() {
        for (bj, s) in row.iter_mut().enumerate() {
            let mut amax = 0f32;
            for r in v.iter().take(((bi + 1) * BLOCK).min(n)).skip(bi * BLOCK) {
                for x in &r[bj * BLOCK..((bj + 1) * BLOCK).min(k)] {
                    amax = amax.max(x.abs());
                }
            }
            if amax > 0.0 {
                *s = amax / E4M3_MAX;
            }
        }
    }
    let scaled: Vec<f32> = (0..n * k).map(|x| v[x / k][x % k] / scale[x / k / BLOCK][x % k / BLOCK]).collect();
    let q = Tensor::from_vec(scaled, (n, k), &Device::Cpu).unwrap().to_dtype(DType::F8E4M3).unwrap();
    let qf = q.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
    let deq: Vec<f32> = (0..n * k).map(|x| qf[x / k][x % k] * scale[x / k / BLOCK][x % k / BLOCK]).collect();
    (q, Tensor::new(scale, &Device::Cpu).unwrap(), Tensor::from_vec(deq, (n, k), &Device::Cpu).unwrap())
}

/// Writes the tiny checkpoint and its twin under a scratch directory
/// named by `tag`.
///
/// Scales: embeddings of standard deviation 1; each projection 0.5 /
/// sqrt(K), so a layer adds to the residual stream less than the
/// embedding holds (as in trained models, where a token's next-token
/// preference is not a coin toss); the LM head 0.25 per weight (logits of
/// standard deviation ~4).
pub fn tiny_fp8_checkpoint(tag: &str) -> TinyFp8 {
    let base = std::env::temp_dir().join(format!("kvc-tiny-fp8-{tag}-{}", std::process::id()));
    let (fp8_dir, deq_dir) = (base.join("fp8"), base.join("dequantized"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let mut plain: Vec<(String, Tensor)> = Vec::new();
    let mut quantized: Vec<(String, Tensor)> = Vec::new();
    let proj = |rng: &mut rand::rngs::StdRng, n: usize, k: usize| draw(rng, n, k, 0.5 / (k as f32).sqrt());
    plain.push(("model.embed_tokens.weight".into(), draw(&mut rng, TINY_VOCAB, HIDDEN, 1.0)));
    plain.push(("lm_head.weight".into(), draw(&mut rng, TINY_VOCAB, HIDDEN, 0.25)));
    plain.push(("model.norm.weight".into(), Tensor::ones(HIDDEN, DType::BF16, &Device::Cpu).unwrap()));
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            plain.push((format!("{p}.{norm}.weight"), Tensor::ones(HIDDEN, DType::BF16, &Device::Cpu).unwrap()));
        }
        for norm in ["q_norm", "k_norm"] {
            plain.push((format!("{p}.self_attn.{norm}.weight"), Tensor::ones(HEAD_DIM, DType::BF16, &Device::Cpu).unwrap()));
        }
        for (name, n, k) in [
            ("q_proj", HEADS * HEAD_DIM, HIDDEN),
            ("k_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("o_proj", HIDDEN, HEADS * HEAD_DIM),
        ] {
            quantized.push((format!("{p}.self_attn.{name}.weight"), proj(&mut rng, n, k)));
        }
        if l == 0 {
            for (name, n, k) in
                [("gate_proj", INTERMEDIATE, HIDDEN), ("up_proj", INTERMEDIATE, HIDDEN), ("down_proj", HIDDEN, INTERMEDIATE)]
            {
                quantized.push((format!("{p}.mlp.{name}.weight"), proj(&mut rng, n, k)));
            }
        } else {
            // The router stays bf16; larger, so the experts' choice is not a tie.
            plain.push((format!("{p}.mlp.gate.weight"), draw(&mut rng, EXPERTS, HIDDEN, 2.0 / (HIDDEN as f32).sqrt())));
            for e in 0..EXPERTS {
                for (name, n, k) in [
                    ("gate_proj", MOE_INTERMEDIATE, HIDDEN),
                    ("up_proj", MOE_INTERMEDIATE, HIDDEN),
                    ("down_proj", HIDDEN, MOE_INTERMEDIATE),
                ] {
                    quantized.push((format!("{p}.mlp.experts.{e}.{name}.weight"), proj(&mut rng, n, k)));
                }
            }
        }
    }
    let (mut fp8, mut deq) = (HashMap::new(), HashMap::new());
    for (name, t) in plain {
        deq.insert(name.clone(), t.to_dtype(DType::F32).unwrap());
        fp8.insert(name, t);
    }
    for (name, t) in quantized {
        let (q, s, d) = quantize(&t);
        fp8.insert(format!("{name}_scale_inv"), s);
        fp8.insert(name.clone(), q);
        deq.insert(name, d);
    }
    for (dir, tensors, fp8) in [(&fp8_dir, &fp8, true), (&deq_dir, &deq, false)] {
        std::fs::create_dir_all(dir).unwrap();
        candle_core::safetensors::save(tensors, dir.join("model.safetensors")).unwrap();
        std::fs::write(dir.join("config.json"), config(fp8).to_string()).unwrap();
    }
    TinyFp8 { fp8: fp8_dir, dequantized: deq_dir, base }
}

/// A fixed prompt set for the tiny model: `count` prompts of lengths from
/// 3 to ~130 tokens (several 16-token KV blocks, uneven ends), token ids
/// drawn from a seeded generator.
pub fn tiny_prompts(count: usize) -> Vec<Vec<u32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3535);
    (0..count).map(|i| (0..3 + i * 127 / count.max(1)).map(|_| rng.random_range(3..TINY_VOCAB as u32)).collect()).collect()
}
