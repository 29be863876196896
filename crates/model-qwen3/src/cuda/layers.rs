//! Launchers of the per-token kernels (kernels/layers.cu, moe.cu) that come
//! in two forms: a vector kernel (16-byte accesses, registers instead of
//! shared staging) where the shape allows, a scalar one for any shape.
//! [`Form::Scalar`] forces the latter (the GPU tests hold the two against
//! each other at production shapes).

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{cuda_dev, empty, grid1, launch, ptr, CacheFormat, Kernels};

/// Which kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The vector kernel where the shape allows, else the scalar one.
    Auto,
    Scalar,
}

/// The vector kernels index in 32 bits over 8-element vectors.
const VECTOR_ELEMS_BELOW: usize = 1 << 35;

fn vectorizable(form: Form, rows: usize, cols: usize) -> bool {
    form == Form::Auto && cols % 8 == 0 && rows * cols < VECTOR_ELEMS_BELOW
}

/// `gu: [R, 2I]` (gate | up) -> `[R, I]` = bf16(silu(gate)) * up.
pub fn silu_mul(k: &Kernels, gu: &Tensor, form: Form) -> Result<Tensor> {
    let (r, i2) = gu.dims2()?;
    let i = i2 / 2;
    let out = empty(cuda_dev(gu.device())?, (r, i), DType::BF16)?;
    if vectorizable(form, r, i) {
        launch!(k.silu_mul, grid1(r * i / 8, 256), ptr(gu)?, ptr(&out)?, r as i32, i as i32)?;
    } else {
        launch!(k.silu_mul_scalar, grid1(r * i, 256), ptr(gu)?, ptr(&out)?, r as i32, i as i32)?;
    }
    Ok(out)
}

/// `y[t] = sum_k w[t, k] * rows[pos(t, k)]` for `y: [T, H]`, `pos` =
/// `inv[t * K + k]`, or the pair itself without `inv`.
pub fn moe_sum(k: &Kernels, rows: &Tensor, w: &Tensor, inv: Option<&Tensor>, y: &Tensor, top_k: usize, form: Form) -> Result<()> {
    let (t, h) = y.dims2()?;
    let inv = match inv {
        Some(i) => ptr(i)?,
        None => 0u64,
    };
    let (ti, ki, hi) = (t as i32, top_k as i32, h as i32);
    if vectorizable(form, t, h) {
        launch!(k.moe_sum, grid1(t * h / 8, 256), ptr(rows)?, ptr(w)?, inv, ptr(y)?, ti, ki, hi)
    } else {
        launch!(k.moe_sum_scalar, grid1(t * h, 256), ptr(rows)?, ptr(w)?, inv, ptr(y)?, ti, ki, hi)
    }
}

/// `x += h` in place (bf16 adds), then returns `rmsnorm(x)` with weight
/// `w` (`add_rmsnorm`); `x, h: [T, H]` bf16.
pub fn add_rmsnorm(k: &Kernels, x: &Tensor, h: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let (t, hid) = x.dims2()?;
    let out = empty(cuda_dev(x.device())?, (t, hid), DType::BF16)?;
    let cfg = LaunchConfig { grid_dim: (t as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    launch!(k.add_rmsnorm, cfg, ptr(x)?, ptr(h)?, ptr(w)?, ptr(&out)?, hid as i32, eps).map(|_| out)
}

/// An MoE block's result before its routing-weighted sum: every (token,
/// chosen expert) pair's output row and weight. [`MoeRows::sum`] is the
/// block's `[T, H]`; the model adds the sum to the residual and normalises
/// in the same launch instead ([`moe_sum_add_rmsnorm`]).
pub struct MoeRows {
    /// `[T * top_k, H]` bf16: pair p's row at `inv[p]` (rows in expert
    /// order), or at p without `inv`.
    pub rows: Tensor,
    /// `[T * top_k]` f32: each pair's routing weight.
    pub w: Tensor,
    /// `[T * top_k]` u32, or None (the identity).
    pub inv: Option<Tensor>,
    pub top_k: usize,
    /// T.
    pub tokens: usize,
}

impl MoeRows {
    /// `y[t] = sum_k w[t, k] * rows[pos(t, k)]`: `[T, H]` bf16 ([`moe_sum`]).
    pub fn sum(&self, k: &Kernels) -> Result<Tensor> {
        let h = self.rows.dim(1)?;
        let y = empty(cuda_dev(self.rows.device())?, (self.tokens, h), DType::BF16)?;
        moe_sum(k, &self.rows, &self.w, self.inv.as_ref(), &y, self.top_k, Form::Auto)?;
        Ok(y)
    }
}

/// `x += moe.sum()` in place, then returns `rmsnorm(x)` with weight `w`:
/// [`MoeRows::sum`] then [`add_rmsnorm`] in one launch
/// (`moe_sum_add_rmsnorm`: the same bits for H <= 2048; beyond, the sum of
/// squares in another order) where H % 8 == 0, else those two.
pub fn moe_sum_add_rmsnorm(k: &Kernels, x: &Tensor, moe: &MoeRows, w: &Tensor, eps: f32) -> Result<Tensor> {
    let (t, h) = x.dims2()?;
    if h % 8 != 0 || moe.tokens != t || moe.rows.dims2()? != (t * moe.top_k, h) {
        return add_rmsnorm(k, x, &moe.sum(k)?, w, eps);
    }
    let out = empty(cuda_dev(x.device())?, (t, h), DType::BF16)?;
    let inv = match &moe.inv {
        Some(i) => ptr(i)?,
        None => 0u64,
    };
    let cfg = LaunchConfig { grid_dim: (t as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (kk, hi) = (moe.top_k as i32, h as i32);
    launch!(k.moe_sum_add_rmsnorm, cfg, ptr(x)?, ptr(&moe.rows)?, ptr(&moe.w)?, inv, ptr(w)?, ptr(&out)?, kk, hi, eps).map(|_| out)
}

/// One layer's q/k RMSNorm + RoPE + paged K/V store (`qk_norm_rope_store`):
/// q heads to `q_out`, K and V heads into the layer's cache at each token's
/// slot (negative: not stored).
pub struct RopeStore<'a> {
    /// `[T, (nh + 2 nkv) * hd]` bf16
    pub qkv: &'a Tensor,
    pub q_norm: &'a Tensor,
    pub k_norm: &'a Tensor,
    /// `[T]` u32 positions and slots.
    pub pos: &'a Tensor,
    pub slots: &'a Tensor,
    /// `[T, nh * hd]` bf16, or u8 holding e4m3 with `q_e4m3`.
    pub q_out: &'a Tensor,
    /// Some(inv): Q written as e4m3(bf16(q) x inv), what cuDNN's FP8
    /// attention reads (a step whose attention is all that route, over an
    /// FP8 cache); one pass where a vector kernel has the head dim, else
    /// the bf16 rows quantized after.
    pub q_e4m3: Option<f32>,
    /// The layer's first K/V byte in the pool.
    pub layer_ptr: u64,
    /// What the layer holds.
    pub cache: CacheFormat,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub eps: f32,
    /// `[hd / 2]` f32 (rope.rs: default, linear or YaRN).
    pub inv_freq: &'a Tensor,
    /// cos and sin are multiplied by it (YaRN's attention factor).
    pub attn_scale: f32,
}

impl RopeStore<'_> {
    pub fn launch(&self, k: &Kernels, form: Form) -> Result<()> {
        let Some(inv) = self.q_e4m3 else { return self.launch_into(k, form, self.q_out, None) };
        if !matches!(self.cache, CacheFormat::Fp8 { .. }) || self.q_out.dtype() != DType::U8 {
            candle_core::bail!("an e4m3 Q is written over an FP8 cache into u8 rows, not {:?} / {:?}", self.cache, self.q_out.dtype());
        }
        let fused = k.qk_norm_rope_store_e4m3q.iter().find(|(d, _)| *d == self.head_dim).map(|(_, f)| f);
        match fused.filter(|_| form == Form::Auto) {
            Some(f) => self.launch_into(k, form, self.q_out, Some((f, inv))),
            None => {
                let q = empty(cuda_dev(self.qkv.device())?, self.q_out.shape(), DType::BF16)?;
                self.launch_into(k, form, &q, None)?;
                super::cudnn_fp8::quantize_q(k, &q, self.q_out, inv)
            }
        }
    }

    /// The launch writing Q into `q_out`: bf16, or e4m3 by `e4m3q` (the
    /// fused kernel and its inverse scale).
    fn launch_into(&self, k: &Kernels, form: Form, q_out: &Tensor, e4m3q: Option<(&super::CudaFunc, f32)>) -> Result<()> {
        let t = self.qkv.dim(0)?;
        // 8 warps a block, a head a warp: few tokens spread their heads over
        // several blocks (a decode's 40 heads in 5), many tokens keep one
        // block each (each block computes its token's cos/sin once).
        let heads = self.num_heads + 2 * self.num_kv_heads;
        let groups = heads.div_ceil(8).min((1024 / t.max(1)).max(1));
        let cfg = LaunchConfig { grid_dim: (t as u32, groups as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (nh, nkv, hd, bs) = (self.num_heads as i32, self.num_kv_heads as i32, self.head_dim as i32, self.block_size as i32);
        let (qkv, qw, kw, pos, slots, q) =
            (ptr(self.qkv)?, ptr(self.q_norm)?, ptr(self.k_norm)?, ptr(self.pos)?, ptr(self.slots)?, ptr(q_out)?);
        let inv_freq = ptr(self.inv_freq)?;
        let kernels = k.cache(self.cache);
        let scales = self.cache.scale_args();
        if let Some((f, inv)) = e4m3q {
            let args = [scales.as_slice(), &[inv]].concat();
            return launch!(f, cfg; &args, qkv, qw, kw, pos, slots, q, self.layer_ptr, nh, nkv, bs, self.eps, inv_freq, self.attn_scale);
        }
        let vector = kernels.qk_norm_rope_store_vec.iter().find(|(d, _)| *d == self.head_dim).map(|(_, f)| f);
        match vector.filter(|_| form == Form::Auto) {
            Some(f) => {
                launch!(f, cfg; &scales, qkv, qw, kw, pos, slots, q, self.layer_ptr, nh, nkv, bs, self.eps, inv_freq, self.attn_scale)
            }
            None => launch!(
                kernels.qk_norm_rope_store,
                cfg;
                &scales,
                qkv,
                qw,
                kw,
                pos,
                slots,
                q,
                self.layer_ptr,
                nh,
                nkv,
                hd,
                bs,
                self.eps,
                inv_freq,
                self.attn_scale
            ),
        }
    }
}
