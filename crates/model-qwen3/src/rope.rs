//! Rotary position embedding (rotate-half, as in HF's Qwen3), computed for
//! arbitrary per-token positions in f32 like transformers does, with the
//! frequency scalings transformers defines for long contexts that depend
//! on the checkpoint only ([`RopeScaling`]: `linear`, `yarn`), and
//! `dynamic` NTK as vLLM serves it (one table for the whole scaled window).

use candle_core::{Device, Result, Tensor};

/// How a checkpoint scales RoPE past its pretraining window (config.json's
/// `rope_scaling` or `rope_parameters`), as transformers'
/// `modeling_rope_utils` computes it.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        factor: f64,
    },
    /// YaRN: frequencies interpolated by `factor` below the correction
    /// range set by `beta_fast`/`beta_slow` over the original window, kept
    /// above it, blended linearly inside it; cos and sin scaled by
    /// `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
    /// Dynamic NTK as vLLM serves it: transformers raises the base with
    /// each batch's length `L` (`base * (factor * L / window - (factor -
    /// 1))^(d / (d - 2))` once `L` passes `window`); vLLM computes that
    /// table once, at the longest length it serves, `window * factor`, and
    /// uses it at every position. kvc does as vLLM (a KV cache cannot be
    /// re-rotated per batch), so its logits equal transformers' for a
    /// sequence of exactly `window * factor` tokens.
    DynamicNtk {
        factor: f64,
        /// `max_position_embeddings` (transformers' and vLLM's window).
        window: usize,
    },
}

impl RopeScaling {
    /// The config's name for it.
    pub fn name(&self) -> &'static str {
        match self {
            RopeScaling::None => "default",
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Yarn { .. } => "yarn",
            RopeScaling::DynamicNtk { .. } => "dynamic",
        }
    }

    /// The factor cos and sin are multiplied by.
    pub fn attention_factor(&self) -> f64 {
        match self {
            RopeScaling::Yarn { attention_factor, .. } => *attention_factor,
            _ => 1.0,
        }
    }
}

pub struct Rope {
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention scaling; 1 otherwise).
    scale: f32,
}

/// YaRN's dimension for `rotations` full turns over `window` positions.
fn correction_dim(rotations: f64, dim: usize, base: f64, window: usize) -> f64 {
    (dim as f64 * (window as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Self {
        // HF: 1 / theta^(arange(0, dim, 2) / dim), in float32.
        let pos_freqs: Vec<f32> = (0..head_dim / 2).map(|i| (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        let inv_freq = match scaling {
            RopeScaling::None => pos_freqs.iter().map(|p| 1.0 / p).collect(),
            RopeScaling::DynamicNtk { factor, window } => {
                // At L = window * factor: factor * L / window - (factor - 1).
                let len = *window as f64 * factor;
                let dim = head_dim as f64;
                let base = theta * (factor * len / *window as f64 - (factor - 1.0)).powf(dim / (dim - 2.0));
                (0..head_dim / 2).map(|i| 1.0 / (base as f32).powf((2 * i) as f32 / head_dim as f32)).collect()
            }
            RopeScaling::Linear { factor } => pos_freqs.iter().map(|p| 1.0 / p / *factor as f32).collect(),
            RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, truncate, .. } => {
                let mut low = correction_dim(*beta_fast, head_dim, theta, *original_max_position_embeddings);
                let mut high = correction_dim(*beta_slow, head_dim, theta, *original_max_position_embeddings);
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0) as f32, high.min(head_dim as f64 - 1.0) as f32);
                if low == high {
                    high += 0.001;
                }
                pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        let (extra, inter) = (1.0 / p, 1.0 / (*factor as f32 * p));
                        inter * (1.0 - extrapolation) + extra * extrapolation
                    })
                    .collect()
            }
        };
        Self { inv_freq, scale: scaling.attention_factor() as f32 }
    }

    /// The frequencies, `head_dim / 2` of them (the CUDA kernels take them
    /// as a table).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// What cos and sin are multiplied by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// cos and sin tables `[tokens, head_dim / 2]` for the given positions.
    pub fn cos_sin(&self, positions: &[u32], device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos() * self.scale);
                sin.push(a.sin() * self.scale);
            }
        }
        let shape = (positions.len(), half);
        Ok((Tensor::from_vec(cos, shape, device)?, Tensor::from_vec(sin, shape, device)?))
    }

    /// Applies the rotation to `x: [tokens, heads, head_dim]`.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        // candle's kernel wants [batch, heads, tokens, dim].
        let xt = x.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let y = candle_nn::rotary_emb::rope(&xt, &cos.to_dtype(dtype)?, &sin.to_dtype(dtype)?)?;
        y.squeeze(0)?.transpose(0, 1)?.contiguous()
    }
}
