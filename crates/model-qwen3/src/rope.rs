//! Rotary position embedding (rotate-half, as in HF's Qwen3), computed for
//! arbitrary per-token positions in f32 like transformers does.

use candle_core::{Device, Result, Tensor};

pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64) -> Self {
        // HF: 1 / theta^(arange(0, dim, 2) / dim), in float32.
        let inv_freq = (0..head_dim / 2).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        Self { inv_freq }
    }

    /// cos and sin tables `[tokens, head_dim / 2]` for the given positions.
    pub fn cos_sin(&self, positions: &[u32], device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
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
