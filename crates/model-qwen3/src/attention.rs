//! Grouped-query attention with q/k RMSNorm over the paged KV pool.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Linear, RmsNorm, VarBuilder};
use kvc_kv_pool::KvStorage;

use crate::batch::BatchInput;
use crate::config::Qwen3Config;
use crate::rope::Rope;

pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

fn linear(in_dim: usize, out_dim: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    if bias {
        candle_nn::linear(in_dim, out_dim, vb)
    } else {
        candle_nn::linear_no_bias(in_dim, out_dim, vb)
    }
}

impl Attention {
    pub fn new(cfg: &Qwen3Config, vb: VarBuilder) -> Result<Self> {
        let (h, hd, nh, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
        let b = cfg.attention_bias;
        Ok(Self {
            q_proj: linear(h, nh * hd, b, vb.pp("q_proj"))?,
            k_proj: linear(h, nkv * hd, b, vb.pp("k_proj"))?,
            v_proj: linear(h, nkv * hd, b, vb.pp("v_proj"))?,
            o_proj: linear(nh * hd, h, b, vb.pp("o_proj"))?,
            q_norm: candle_nn::rms_norm(hd, cfg.rms_norm_eps, vb.pp("q_norm"))?,
            k_norm: candle_nn::rms_norm(hd, cfg.rms_norm_eps, vb.pp("k_norm"))?,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
        })
    }

    /// `x: [tokens, hidden]` -> `[tokens, hidden]`; writes this batch's K/V
    /// into `kv` at `slots`, then attends over each sequence's whole context.
    pub fn forward(
        &self,
        x: &Tensor,
        batch: &BatchInput,
        slots: &[usize],
        cos_sin: &(Tensor, Tensor),
        kv: &mut KvStorage,
        layer: usize,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = self.q_norm.forward(&self.q_proj.forward(x)?.reshape((t, nh, hd))?)?;
        let k = self.k_norm.forward(&self.k_proj.forward(x)?.reshape((t, nkv, hd))?)?;
        let v = self.v_proj.forward(x)?.reshape((t, nkv, hd))?;
        let q = Rope::apply(&q, &cos_sin.0, &cos_sin.1)?;
        let k = Rope::apply(&k, &cos_sin.0, &cos_sin.1)?;
        kv.write(layer, slots, &k, &v).map_err(candle_core::Error::wrap)?;

        let mut outs = Vec::with_capacity(batch.seqs.len());
        for s in &batch.seqs {
            let (kc, vc) = kv.gather(layer, s.block_table, s.context_len, x.device()).map_err(candle_core::Error::wrap)?;
            let qs = q.narrow(0, s.start, s.len)?;
            outs.push(self.attend(&qs, &kc, &vc, s.context_len)?);
        }
        let o = Tensor::cat(&outs, 0)?;
        self.o_proj.forward(&o)
    }

    /// Causal attention of `q: [len, nh, hd]` (the last `len` positions of
    /// the context) over `k, v: [ctx, nkv, hd]`; returns `[len, nh * hd]`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, ctx: usize) -> Result<Tensor> {
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let groups = nh / nkv;
        let len = q.dim(0)?;
        let dtype = q.dtype();
        // Query heads g*groups..(g+1)*groups share KV head g (HF's repeat_kv).
        let q = q.to_dtype(DType::F32)?.reshape((len, nkv, groups, hd))?.permute((1, 2, 0, 3))?.reshape((nkv, groups * len, hd))?;
        let k = k.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?; // [nkv, ctx, hd]
        let v = v.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?; // [nkv, groups*len, ctx]
        if len > 1 {
            let first = ctx - len;
            let mask: Vec<f32> =
                (0..len).flat_map(|i| (0..ctx).map(move |j| if j <= first + i { 0.0 } else { f32::NEG_INFINITY })).collect();
            let mask = Tensor::from_vec(mask, (len, ctx), q.device())?;
            let mask = mask.unsqueeze(0)?.repeat((groups, 1, 1))?.reshape((1, groups * len, ctx))?;
            scores = scores.broadcast_add(&mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let o = probs.matmul(&v)?; // [nkv, groups*len, hd]
        o.reshape((nkv, groups, len, hd))?.permute((2, 0, 1, 3))?.reshape((len, nh * hd))?.to_dtype(dtype)
    }
}
