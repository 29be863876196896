//! The sparse MoE block on the GPU, without a host round trip (but for the
//! cuBLAS option below): routing
//! (softmax, top-k) and grouping by expert run on the device, then one
//! grouped-GEMM launch per projection over every active expert: on the CUDA
//! cores for decode-sized batches (each active expert's weights streamed
//! once), on the tensor cores for prefill-sized ones (kvc's kernel, or
//! cuBLAS's grouped GEMM with `KVC_MOE_GEMM=cublas`: moe_cublas.rs).

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{cuda_dev, empty, grid1, launch, ptr, Kernels};

/// Pairs (token x chosen expert) up to which the CUDA-core grouped kernel
/// is used; above it, the tensor-core one (measured on the H200 at the 30B
/// shape: the tensor-core kernel wins from decode batch 16 on).
/// `KVC_MOE_SMALL_PAIRS` or [`set_moe_small_pairs`] override it.
pub const SMALL_PAIRS: usize = 64;

static SMALL_PAIRS_NOW: AtomicUsize = AtomicUsize::new(usize::MAX);

fn small_pairs() -> usize {
    let v = SMALL_PAIRS_NOW.load(Ordering::Relaxed);
    if v != usize::MAX {
        return v;
    }
    let v = std::env::var("KVC_MOE_SMALL_PAIRS").ok().and_then(|v| v.parse().ok()).unwrap_or(SMALL_PAIRS);
    SMALL_PAIRS_NOW.store(v, Ordering::Relaxed);
    v
}

/// Sets the crossover between the two grouped-GEMM kernels (tests force
/// each path; 0 = always the tensor-core kernel).
pub fn set_moe_small_pairs(pairs: usize) {
    SMALL_PAIRS_NOW.store(pairs, Ordering::Relaxed);
}

pub struct GpuMoe {
    /// `[E, H]`
    pub router: Tensor,
    /// `[E, 2I, H]` (gate rows, then up rows)
    pub gate_up: Tensor,
    /// `[E, H, I]`
    pub down: Tensor,
    pub num_experts: usize,
    pub intermediate: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
}

pub(crate) fn silu_mul(k: &Kernels, gu: &Tensor) -> Result<Tensor> {
    let (r, i2) = gu.dims2()?;
    let out = empty(cuda_dev(gu.device())?, (r, i2 / 2), DType::BF16)?;
    launch!(k.silu_mul, grid1(r * i2 / 2, 256), ptr(gu)?, ptr(&out)?, r as i32, (i2 / 2) as i32)?;
    Ok(out)
}

impl GpuMoe {
    /// `x: [T, H]` bf16 -> `[T, H]`.
    pub fn forward(&self, k: &Kernels, x: &Tensor) -> Result<Tensor> {
        let dev = cuda_dev(x.device())?;
        let (t, h) = x.dims2()?;
        let (e, i, kk) = (self.num_experts, self.intermediate, self.top_k);
        let tk = t * kk;
        if h % 8 != 0 || i % 8 != 0 || e > 1024 || kk > 32 {
            candle_core::bail!("moe kernels need hidden and moe_intermediate multiples of 8, <= 1024 experts, top-k <= 32");
        }
        let logits = x.matmul(&self.router.t()?)?; // [T, E] bf16
        let ids = empty(dev, tk, DType::U32)?;
        let w = empty(dev, tk, DType::F32)?;
        launch!(
            k.moe_topk,
            grid1(t * 32, 256),
            ptr(&logits)?,
            ptr(&ids)?,
            ptr(&w)?,
            t as i32,
            e as i32,
            kk as i32,
            self.norm_topk_prob as i32
        )?;
        let offsets = empty(dev, e + 1, DType::U32)?;
        let sorted = empty(dev, tk, DType::U32)?;
        // pair -> position in `sorted` (the GEMMs below write in pair order
        // and do not need it; moe_align always produces it).
        let inv = empty(dev, tk, DType::U32)?;
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // Active experts in order, then each expert's first 64-row tile.
        let meta = empty(dev, 2 * e + 1, DType::U32)?;
        launch!(k.moe_align, one, ptr(&ids)?, tk as i32, e as i32, ptr(&offsets)?, ptr(&sorted)?, ptr(&inv)?, ptr(&meta)?)?;

        if tk > small_pairs() && super::moe_cublas::prefill_cublas() {
            return super::moe_cublas::experts(k, dev, x, &self.gate_up, &self.down, &offsets, &sorted, &inv, &w, kk);
        }
        let y = empty(dev, (t, h), DType::BF16)?;
        let gu = empty(dev, (tk, 2 * i), DType::BF16)?;
        self.grouped_gemm(k, x, &self.gate_up, &offsets, &sorted, &meta, &gu, 2 * i, h, kk, tk)?;
        let act = silu_mul(k, &gu)?;
        let dn = empty(dev, (tk, h), DType::BF16)?;
        self.grouped_gemm(k, &act, &self.down, &offsets, &sorted, &meta, &dn, h, i, 1, tk)?;
        launch!(k.moe_sum, grid1(t * h, 256), ptr(&dn)?, ptr(&w)?, 0u64, ptr(&y)?, t as i32, kk as i32, h as i32)?;
        Ok(y)
    }

    /// `out[p] = x[p / row_div] W[expert(p)]^T` for every pair p.
    #[allow(clippy::too_many_arguments)]
    fn grouped_gemm(
        &self,
        k: &Kernels,
        x: &Tensor,
        w: &Tensor,
        offsets: &Tensor,
        sorted: &Tensor,
        meta: &Tensor,
        out: &Tensor,
        n: usize,
        kd: usize,
        row_div: usize,
        pairs: usize,
    ) -> Result<()> {
        let e = self.num_experts;
        if pairs <= small_pairs() {
            let mt = (48 * 1024 / (kd * 2)).clamp(1, 8);
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(8) as u32, e.min(pairs) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: (mt * kd * 2) as u32,
            };
            launch!(
                k.moe_gemm_small,
                cfg,
                ptr(x)?,
                ptr(w)?,
                ptr(offsets)?,
                ptr(sorted)?,
                ptr(meta)?,
                ptr(out)?,
                n as i32,
                kd as i32,
                row_div as i32,
                mt as i32,
                e as i32
            )
        } else {
            // Row tiles of 64: at most pairs / 64 + one partial tile per active expert.
            let tiles = pairs / 64 + e.min(pairs);
            let cfg = LaunchConfig { grid_dim: (n.div_ceil(64) as u32, tiles as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
            launch!(
                k.moe_gemm_tc,
                cfg,
                ptr(x)?,
                ptr(w)?,
                ptr(offsets)?,
                ptr(sorted)?,
                ptr(meta)?,
                ptr(out)?,
                n as i32,
                kd as i32,
                row_div as i32,
                e as i32
            )
        }
    }
}
