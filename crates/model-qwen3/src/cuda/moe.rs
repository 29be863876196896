//! The sparse MoE block on the GPU, without a host round trip (but for the
//! cuBLAS option below): routing
//! (softmax, top-k) and grouping by expert run on the device, then one
//! grouped-GEMM launch per projection over every active expert: on the CUDA
//! cores for decode-sized batches (each active expert's weights streamed
//! once), on the tensor cores for prefill-sized ones (CUTLASS's Hopper
//! grouped GEMM where it runs, cuBLAS's, or kvc's kernel: moe_gemm.rs).

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::fp8_linear::Fp8Weight;
use super::gemv::{fits_fp8, one_row_swiglu, small_m_grouped, Weight};
use super::layers::{silu_mul, Form, MoeRows};
use super::moe_cublas::{cublas_grouped, host_offsets};
use super::moe_gemm::{cutlass_grouped, cutlass_tiling, experts_down, gathered_experts, moe_gemm, MoeGemm};
use super::{cuda_dev, empty, grid1, launch, ptr, Kernels};

/// Pairs (token x chosen expert) up to which the CUDA-core grouped kernel
/// is used beside kvc's tensor-core kernel or cuBLAS (measured on the H200
/// at the 30B shape: the tensor-core kernel wins from decode batch 16 on).
pub const SMALL_PAIRS: usize = 64;
/// The same beside CUTLASS's grouped GEMM, whose swapped tiling wins from
/// decode batch 2 on (batch 8 at 2K context as a graph: 7.16 ms a step
/// against 9.29 on the CUDA-core kernel; batch 1: 5.07 against 4.97).
pub const SMALL_PAIRS_CUTLASS: usize = 8;

/// usize::MAX: no override.
static SMALL_PAIRS_NOW: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The CUDA-core kernel's pair limit beside `gemm`: the one set by
/// [`set_moe_small_pairs`] (the engine's kernel plan, tests, benchmarks),
/// else the measured default for `gemm`.
pub(crate) fn small_pairs(gemm: MoeGemm) -> usize {
    let v = SMALL_PAIRS_NOW.load(Ordering::Relaxed);
    if v != usize::MAX {
        return v;
    }
    match gemm {
        MoeGemm::Cutlass(_) => SMALL_PAIRS_CUTLASS,
        MoeGemm::Cublas | MoeGemm::Kvc => SMALL_PAIRS,
    }
}

/// Sets the CUDA-core kernel's pair limit (tests and benchmarks force each
/// path; 0 = never the CUDA-core kernel); None: the default again.
pub fn set_moe_small_pairs(pairs: Option<usize>) {
    SMALL_PAIRS_NOW.store(pairs.unwrap_or(usize::MAX), Ordering::Relaxed);
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

/// One batch's routing on the device, as the expert GEMMs read it.
pub(crate) struct Routing {
    /// `[T * K]` f32: each (token, expert) pair's weight.
    w: Tensor,
    /// `[E + 1]` u32: each expert's first row among the sorted pairs.
    offsets: Tensor,
    /// `[T * K]` u32: the pairs in expert order.
    sorted: Tensor,
    /// `[T * K]` u32: pair -> its position in `sorted`.
    inv: Tensor,
    /// Active experts in order, then each expert's first 64-row tile.
    meta: Tensor,
}

/// Softmax router, top-k and grouping by expert of `x: [T, H]` bf16 over
/// `router: [E, H]`, all on the device.
fn route(k: &Kernels, x: &Tensor, router: &Tensor, e: usize, i: usize, kk: usize, norm_topk_prob: bool) -> Result<Routing> {
    let dev = cuda_dev(x.device())?;
    let (t, h) = x.dims2()?;
    let tk = t * kk;
    if h % 8 != 0 || i % 8 != 0 || e > 1024 || kk > 32 {
        candle_core::bail!("moe kernels need hidden and moe_intermediate multiples of 8, <= 1024 experts, top-k <= 32");
    }
    let ids = empty(dev, tk, DType::U32)?;
    let w = empty(dev, tk, DType::F32)?;
    let offsets = empty(dev, e + 1, DType::U32)?;
    let sorted = empty(dev, tk, DType::U32)?;
    let inv = empty(dev, tk, DType::U32)?;
    let meta = empty(dev, 2 * e + 1, DType::U32)?;
    let renorm = norm_topk_prob as i32;
    let (ids_p, w_p, off_p, sorted_p, inv_p, meta_p) = (ptr(&ids)?, ptr(&w)?, ptr(&offsets)?, ptr(&sorted)?, ptr(&inv)?, ptr(&meta)?);
    let fused = t <= ROUTER_ROUTE_TOKENS && e <= ROUTE_BLOCK && x.dtype() == DType::BF16 && router.dtype() == DType::BF16;
    if fused && x.is_contiguous() && router.is_contiguous() {
        // A few tokens: the router's logits, the routing and the grouping
        // in one launch (a warp an expert; the last block routes).
        let logits = empty(dev, (t, e), DType::BF16)?;
        let threads = (e.next_multiple_of(32)).max(256);
        let blocks = e.div_ceil(threads / 32);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (threads as u32, 1, 1), shared_mem_bytes: 0 };
        let (ti, ei, hi, ki) = (t as i32, e as i32, h as i32, kk as i32);
        launch!(
            k.moe_router_route,
            cfg,
            ptr(x)?,
            ptr(router)?,
            ptr(&logits)?,
            ptr(&k.route_counter)?,
            ids_p,
            w_p,
            ti,
            ei,
            hi,
            ki,
            renorm,
            off_p,
            sorted_p,
            inv_p,
            meta_p
        )?;
        return Ok(Routing { w, offsets, sorted, inv, meta });
    }
    let logits = x.matmul(&router.t()?)?; // [T, E] bf16
    if t <= ROUTE_ONE_BLOCK_TOKENS && e <= ROUTE_BLOCK {
        // Decode: routing and grouping in one block, one launch.
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (ROUTE_BLOCK as u32, 1, 1), shared_mem_bytes: 0 };
        let (ti, ei, ki) = (t as i32, e as i32, kk as i32);
        launch!(k.moe_route, one, ptr(&logits)?, ids_p, w_p, ti, ei, ki, renorm, off_p, sorted_p, inv_p, meta_p)?;
    } else {
        launch!(k.moe_topk, grid1(t * 32, 256), ptr(&logits)?, ids_p, w_p, t as i32, e as i32, kk as i32, renorm)?;
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        launch!(k.moe_align, one, ids_p, tk as i32, e as i32, off_p, sorted_p, inv_p, meta_p)?;
    }
    Ok(Routing { w, offsets, sorted, inv, meta })
}

/// Tokens up to which an FP8 MoE step runs its experts on the few-row
/// kernel (gemv.cu's `small_m_gemm_fp8`) rather than CUTLASS's grouped FP8
/// GEMM: measured on the H200 at the 30B shape, 2K context, graphs, against
/// bf16: 2 tokens 1.09x on it against 1.02x on CUTLASS, 4 tokens 0.88x
/// against 0.95x.
pub const FEW_TOKENS: usize = 2;

/// The MoE block with its experts in FP8 (fp8_linear.rs): [`GpuMoe`]'s
/// routing, then both expert projections on the few-row FP8 kernel up to
/// [`FEW_TOKENS`] tokens, on CUTLASS's grouped FP8 GEMM beyond.
pub struct Fp8Moe {
    /// `[E, H]` bf16
    pub router: Tensor,
    /// `[E, 2I, H]` (gate rows, then up rows)
    pub gate_up: Fp8Weight,
    /// `[E, H, I]`
    pub down: Fp8Weight,
    pub num_experts: usize,
    pub intermediate: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
}

impl Fp8Moe {
    /// `x: [T, H]` bf16 -> `[T, H]`; nothing is read back to the host.
    pub fn forward(&self, k: &Kernels, x: &Tensor) -> Result<Tensor> {
        self.forward_rows(k, x)?.sum(k)
    }

    /// [`Fp8Moe::forward`] before the routing-weighted sum.
    pub fn forward_rows(&self, k: &Kernels, x: &Tensor) -> Result<MoeRows> {
        let dev = cuda_dev(x.device())?;
        let (e, i, kk) = (self.num_experts, self.intermediate, self.top_k);
        let r = route(k, x, &self.router, e, i, kk, self.norm_topk_prob)?;
        let (t, h) = x.dims2()?;
        let (gq, dq) = (self.gate_up.parts().0, self.down.parts().0);
        if t <= FEW_TOKENS && fits_fp8(gq.dim(1)?, gq.dim(2)?) && fits_fp8(dq.dim(1)?, dq.dim(2)?) {
            // One or two tokens: each active expert's weights streamed once
            // by the few-row kernel against its pairs' rows in bf16.
            let (tk, groups) = (t * kk, (t * kk).min(e));
            let routing = (&r.offsets, &r.sorted, &r.meta);
            let act = swiglu(k, x, Weight::fp8(self.gate_up.parts()), routing, (tk, i), kk, groups)?;
            let dn = empty(dev, (tk, h), DType::BF16)?;
            small_m_grouped(k, &act, Weight::fp8(self.down.parts()), routing, &dn, 1, groups)?;
            return Ok(MoeRows { rows: dn, w: r.w, inv: None, top_k: kk, tokens: t });
        }
        // Each token quantized once, then gathered into expert order as
        // e4m3 rows (not each of its top-k copies quantized after a bf16 gather).
        let gu = empty(dev, (t * kk, 2 * i), DType::BF16)?;
        self.gate_up.grouped_gathered(k, &r.offsets, x, &r.sorted, kk, &gu)?;
        experts_down(dev, &gu, (t, h), &r.w, &r.inv, kk, |gu, dn| self.down.grouped_silu(k, &r.offsets, gu, dn))
    }
}

/// `[pairs, I]` = SiLU * up of the experts' gate|up product over one
/// token's pairs (`dims` = (pairs, I)): in the product's epilogue
/// (gemv.rs's `one_row_swiglu`) where it fits, else the product then
/// `silu_mul`; the same bits either way.
fn swiglu(
    k: &Kernels,
    x: &Tensor,
    w: Weight,
    routing: (&Tensor, &Tensor, &Tensor),
    (pairs, i): (usize, usize),
    row_div: usize,
    groups: usize,
) -> Result<Tensor> {
    let dev = cuda_dev(x.device())?;
    let act = empty(dev, (pairs, i), DType::BF16)?;
    if one_row_swiglu(k, x, w, routing, &act, row_div, groups)? {
        return Ok(act);
    }
    let gu = empty(dev, (pairs, 2 * i), DType::BF16)?;
    small_m_grouped(k, x, w, routing, &gu, row_div, groups)?;
    silu_mul(k, &gu, Form::Auto)
}

/// Threads of `moe_route`'s one block (kernels/moe.cu): it takes at most
/// this many experts.
const ROUTE_BLOCK: usize = 512;
/// Most tokens routed by `moe_route`: one per warp. Its tokens' routing is
/// serial per warp, so larger batches route with one warp per token over
/// many blocks (at 64 tokens, 4 per warp took 41 us per layer against 14
/// for the two kernels on the H200).
const ROUTE_ONE_BLOCK_TOKENS: usize = ROUTE_BLOCK / 32;
/// Most tokens whose router logits `moe_router_route` computes itself
/// (kernels/moe.cu's RT_MAX_T): a decode step of a few sequences, where
/// the router's cuBLAS GEMM was a launch of its own on two CTAs.
const ROUTER_ROUTE_TOKENS: usize = 8;

impl GpuMoe {
    /// `x: [T, H]` bf16 -> `[T, H]`.
    /// `host_sync`: whether the cuBLAS path may read the expert offsets
    /// back to the host (not inside a CUDA graph capture; the CUTLASS path
    /// never does). The expert GEMM is moe_gemm.rs's choice.
    pub fn forward(&self, k: &Kernels, x: &Tensor, host_sync: bool) -> Result<Tensor> {
        self.forward_rows(k, x, host_sync)?.sum(k)
    }

    /// [`GpuMoe::forward`] before the routing-weighted sum.
    pub fn forward_rows(&self, k: &Kernels, x: &Tensor, host_sync: bool) -> Result<MoeRows> {
        let dev = cuda_dev(x.device())?;
        let (t, h) = x.dims2()?;
        let (e, i, kk) = (self.num_experts, self.intermediate, self.top_k);
        let tk = t * kk;
        let Routing { w, offsets, sorted, inv, meta } = route(k, x, &self.router, e, i, kk, self.norm_topk_prob)?;

        let choice = moe_gemm()?;
        let small = small_pairs(choice);
        let gemm = if tk > small { choice } else { MoeGemm::Kvc };
        let (gu_w, dn_w) = (&self.gate_up, &self.down);
        match gemm {
            MoeGemm::Cutlass(tiling) => {
                let tiling = tiling.unwrap_or_else(|| cutlass_tiling(tk, e));
                let run = |a: &Tensor, w: &Tensor, out: &Tensor| cutlass_grouped(dev, &offsets, a, w, out, tiling);
                return gathered_experts(k, dev, x, gu_w, dn_w, 2 * i, &sorted, &inv, &w, kk, run);
            }
            MoeGemm::Cublas if host_sync => {
                let host = host_offsets(&offsets, e, tk)?;
                let run = |a: &Tensor, w: &Tensor, out: &Tensor| cublas_grouped(dev, &host, a, w, out);
                return gathered_experts(k, dev, x, gu_w, dn_w, 2 * i, &sorted, &inv, &w, kk, run);
            }
            // kvc's kernels; also cuBLAS's choice inside a graph capture.
            MoeGemm::Cublas | MoeGemm::Kvc => {}
        }
        let act = if self.one_row(tk, small) {
            // One token: SiLU * up in the gate|up product's epilogue.
            swiglu(k, x, Weight::Bf16(&self.gate_up), (&offsets, &sorted, &meta), (tk, i), kk, tk)?
        } else {
            let gu = empty(dev, (tk, 2 * i), DType::BF16)?;
            self.grouped_gemm(k, x, &self.gate_up, &offsets, &sorted, &meta, &gu, 2 * i, h, kk, tk, small)?;
            silu_mul(k, &gu, Form::Auto)?
        };
        let dn = empty(dev, (tk, h), DType::BF16)?;
        self.grouped_gemm(k, &act, &self.down, &offsets, &sorted, &meta, &dn, h, i, 1, tk, small)?;
        Ok(MoeRows { rows: dn, w, inv: None, top_k: kk, tokens: t })
    }

    /// Whether `pairs` routed pairs are one token's, each on its own
    /// expert, for the few-row kernels (below `small_pairs`): the one-row
    /// kernels' case.
    fn one_row(&self, pairs: usize, small_pairs: usize) -> bool {
        pairs <= small_pairs && pairs == self.top_k && pairs <= self.num_experts
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
        small_pairs: usize,
    ) -> Result<()> {
        let e = self.num_experts;
        if self.one_row(pairs, small_pairs) {
            // One token (its pairs on distinct experts, a row each): the
            // flat few-row kernel streams the experts' weights fastest
            // (a batch-1 decode step 4.64 ms against 4.83, H200); from
            // two rows an expert on, the per-expert kernel below does.
            small_m_grouped(k, x, Weight::Bf16(w), (offsets, sorted, meta), out, row_div, e.min(pairs))
        } else {
            let p = [ptr(x)?, ptr(w)?, ptr(offsets)?, ptr(sorted)?, ptr(meta)?, ptr(out)?];
            let (n32, kd32, rd32, e32) = (n as i32, kd as i32, row_div as i32, e as i32);
            if pairs <= small_pairs {
                let mt = (48 * 1024 / (kd * 2)).clamp(1, 8);
                let grid_dim = (n.div_ceil(8) as u32, e.min(pairs) as u32, 1);
                let cfg = LaunchConfig { grid_dim, block_dim: (256, 1, 1), shared_mem_bytes: (mt * kd * 2) as u32 };
                launch!(k.moe_gemm_small, cfg, p[0], p[1], p[2], p[3], p[4], p[5], n32, kd32, rd32, mt as i32, e32)
            } else {
                // Row tiles of 64: at most pairs / 64 + one partial tile per active expert.
                let tiles = pairs / 64 + e.min(pairs);
                let cfg = LaunchConfig { grid_dim: (n.div_ceil(64) as u32, tiles as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
                launch!(k.moe_gemm_tc, cfg, p[0], p[1], p[2], p[3], p[4], p[5], n32, kd32, rd32, e32)
            }
        }
    }
}
