//! Grouped-query attention with q/k RMSNorm over the paged KV pool.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Linear, RmsNorm, VarBuilder};
use kvc_kv_pool::KvStorage;
use rayon::prelude::*;

use crate::batch::BatchInput;
use crate::config::Qwen3Config;
use crate::rope::Rope;
use crate::row_invariant::linear_rows;

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
        let q = self.q_norm.forward(&linear_rows(&self.q_proj, x)?.reshape((t, nh, hd))?)?;
        let k = self.k_norm.forward(&linear_rows(&self.k_proj, x)?.reshape((t, nkv, hd))?)?;
        let v = linear_rows(&self.v_proj, x)?.reshape((t, nkv, hd))?;
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
        linear_rows(&self.o_proj, &o)
    }

    /// Causal attention of `q: [len, nh, hd]` (the last `len` positions of
    /// the context) over `k, v: [ctx, nkv, hd]`; returns `[len, nh * hd]`.
    ///
    /// Each query row (a position and a head) is computed on its own, over
    /// exactly the positions it sees, with its sums in position order: its
    /// result does not depend on how many positions share its chunk (a
    /// cached prefix or another chunking) or on other sequences, which a
    /// masked `[len, ctx]` product would (crate::row_invariant).
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, ctx: usize) -> Result<Tensor> {
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let groups = nh / nkv;
        let len = q.dim(0)?;
        let (dtype, device) = (q.dtype(), q.device().clone());
        let flat = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        let (q, k, v) = (flat(q)?, flat(k)?, flat(v)?);
        let scale = 1.0 / (hd as f32).sqrt();
        let first = ctx - len;
        let mut out = vec![0f32; len * nh * hd];
        out.par_chunks_mut(hd).enumerate().for_each(|(row, o)| {
            let (i, h) = (row / nh, row % nh);
            // Query heads g*groups..(g+1)*groups share KV head g (HF's repeat_kv).
            let kv_at = |j: usize| (j * nkv + h / groups) * hd;
            let qr = &q[row * hd..][..hd];
            let mut w: Vec<f32> = (0..=first + i).map(|j| dot(qr, &k[kv_at(j)..][..hd]) * scale).collect();
            let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in &mut w {
                *x = (*x - max).exp();
                sum += *x;
            }
            for (j, &x) in w.iter().enumerate() {
                let p = x / sum;
                for (o, &vj) in o.iter_mut().zip(&v[kv_at(j)..][..hd]) {
                    *o += p * vj;
                }
            }
        });
        Tensor::from_vec(out, (len, nh * hd), &device)?.to_dtype(dtype)
    }
}

/// `a . b` summed in eight lanes (j mod 8), then the lanes in order: a
/// fixed order that the compiler can still vectorise.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for (acc, (x, y)) in lanes.iter_mut().zip(x.iter().zip(y)) {
            *acc += x * y;
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    lanes.iter().sum()
}
