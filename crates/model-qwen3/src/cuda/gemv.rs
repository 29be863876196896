//! Products of a few rows with a weight matrix (kernels/gemv.cu's
//! `small_m_gemm`), where the experts of a one-token decode run: each
//! active expert's single row against its weights, a stream over the
//! weights paced by HBM. One flat list of (expert, two columns) tasks over
//! every resident warp: the earlier per-expert kernel left a partial last
//! wave of blocks (~2 TB/s).
//!
//! Measured on the H200 (`kvc-bench layers`, docs/benchmarks.md): on the
//! CUDA cores the kernel is at its best with one row; from two rows on its
//! work per weight grows with the rows and cuBLAS's (dense layers) or
//! CUTLASS's (experts) tensor-core kernels win, so it runs only the
//! experts of a single-token decode, and the dense layers stay on cuBLAS.
//! [`small_m_linear`] is its dense form, for the benchmark and the tests.
//!
//! One row a group (a one-token decode: the FP8 model's dense layers, and
//! the experts of either) goes to the one-row kernels instead: a warp per
//! task and a grid of every task, the warp's weights requested before the
//! routing's dependent loads (gemv.cu's `one_row_stream`; per layer's four
//! products on one H100 36.0 us against 44.5 in FP8, 55.6 against 67.9 in
//! bf16, docs/benchmarks.md).

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{bail, DType, Result, Tensor};

use super::{cuda_dev, empty, launch_slices, ptr, Kernels};

/// Threads of a block (8 warps).
pub(crate) const BLOCK: u32 = 256;

/// Whether the kernel takes a `[N, K]` weight: N even, K a multiple of 8.
pub(crate) fn fits(n: usize, k: usize) -> bool {
    n % 2 == 0 && k % 8 == 0 && n > 0 && k > 0
}

/// The grid for `tasks` (a group's two output columns each): every task a
/// warp, but no more blocks than the device holds at once (the warps
/// stride over the rest, so there is no partial last wave).
fn grid(k: &Kernels, tasks: usize) -> LaunchConfig {
    let warps_per_block = (BLOCK / 32) as usize;
    let blocks = tasks.div_ceil(warps_per_block).clamp(1, k.small_m_blocks as usize);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The one-row kernels' 16-byte chunks a lane and output column: the
/// smallest that holds a row of K (more: the kernel loops over K).
pub(crate) const ONE_ROW_CHUNKS: [usize; 3] = [2, 4, 8];

/// Warps of a one-row block.
const ONE_ROW_WARPS: usize = 4;

/// The weights of one product: bf16, or e4m3 with its 128x128 block scales.
#[derive(Clone, Copy)]
pub(crate) enum Weight<'a> {
    Bf16(&'a Tensor),
    Fp8 { q: &'a Tensor, scale: &'a Tensor },
}

impl<'a> Weight<'a> {
    /// e4m3 weights and their block scales.
    pub(crate) fn fp8((q, scale): (&'a Tensor, &'a Tensor)) -> Self {
        Self::Fp8 { q, scale }
    }

    /// (N, K) of each `[N, K]` matrix (the last two dims), and whether the
    /// kernels take it ([`fits`] and bf16, or [`fits_fp8`] and e4m3).
    fn matrix(&self) -> Result<(usize, usize, bool)> {
        let t = match self {
            Weight::Bf16(w) => w,
            Weight::Fp8 { q, .. } => q,
        };
        let dims = t.dims();
        let [n, kd] = dims[dims.len().saturating_sub(2)..] else { bail!("weight of shape {:?}: not a matrix", t.shape()) };
        let ok = match self {
            Weight::Bf16(w) => fits(n, kd) && w.dtype() == DType::BF16,
            Weight::Fp8 { q, .. } => fits_fp8(n, kd) && q.dtype() == DType::F8E4M3,
        };
        Ok((n, kd, ok))
    }
}

/// Which kernel [`run`] launches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// `small_m_gemm{,_fp8}`: any rows a group.
    SmallM,
    /// `one_row_gemm{,_fp8}`: one row a group.
    OneRow,
    /// `one_row_swiglu{,_fp8}`: one row a group, a gate|up weight, SiLU * up out.
    OneRowSwiglu,
}

/// Launches `small_m_gemm`, a one-row kernel, or their FP8 forms: `x`
/// against `w` into `out`, over the routing (offsets, sorted pairs, meta)
/// of grouped experts or none (dense); `dims` = (row_div, rows, groups, N,
/// K).
fn run(
    k: &Kernels,
    x: &Tensor,
    w: Weight,
    out: &Tensor,
    routing: Option<(&Tensor, &Tensor, &Tensor)>,
    dims: [i32; 5],
    kernel: Kernel,
) -> Result<()> {
    let tasks = dims[2] as usize * dims[3] as usize / 2;
    let kd = dims[4] as usize;
    let fp8 = matches!(w, Weight::Fp8 { .. });
    let mut ptrs = match w {
        Weight::Bf16(w) => vec![ptr(x)?, ptr(w)?],
        Weight::Fp8 { q, scale } => vec![ptr(x)?, ptr(q)?, ptr(scale)?],
    };
    let (f, cfg) = if kernel == Kernel::SmallM {
        (if fp8 { &k.small_m_gemm_fp8 } else { &k.small_m_gemm }, grid(k, tasks))
    } else {
        if !fp8 {
            ptrs.push(0); // the one-row kernels' (unused) weight scales
        }
        let per_lane = (kd / if fp8 { 16 } else { 8 }).div_ceil(32);
        let i = ONE_ROW_CHUNKS.iter().position(|&c| c >= per_lane).unwrap_or(ONE_ROW_CHUNKS.len() - 1);
        let set = match (kernel, fp8) {
            (Kernel::OneRowSwiglu, true) => &k.one_row_swiglu_fp8,
            (Kernel::OneRowSwiglu, false) => &k.one_row_swiglu,
            (_, true) => &k.one_row_gemm_fp8,
            (_, false) => &k.one_row_gemm,
        };
        let f = &set[i];
        let blocks = tasks.div_ceil(ONE_ROW_WARPS).max(1) as u32;
        (f, LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (32 * ONE_ROW_WARPS as u32, 1, 1), shared_mem_bytes: 0 })
    };
    ptrs.push(ptr(out)?);
    match routing {
        Some((offsets, sorted, meta)) => ptrs.extend([ptr(offsets)?, ptr(sorted)?, ptr(meta)?]),
        None => ptrs.extend([0u64; 3]),
    }
    launch_slices(f, cfg, &ptrs, &dims, &[])
}

/// `x [M, K] @ w [N, K]^T -> [M, N]` bf16, for small M.
pub fn small_m_linear(k: &Kernels, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, kd) = x.dims2()?;
    let (n, kw) = w.dims2()?;
    if kd != kw || !fits(n, kd) || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 {
        bail!("small_m_linear: x {:?} {:?}, w {:?} {:?}", x.shape(), x.dtype(), w.shape(), w.dtype());
    }
    let out = empty(cuda_dev(x.device())?, (m, n), DType::BF16)?;
    run(k, x, Weight::Bf16(w), &out, None, [1, m as i32, 1, n as i32, kd as i32], one_row_if(m == 1))?;
    Ok(out)
}

/// The experts' product for a routed batch: for the `groups` first active
/// experts of `meta` (moe.rs's routing) and each pair p of expert e
/// (`sorted[offsets[e]..offsets[e + 1]]`), `out[p] = x[p / row_div] w[e]^T`.
/// `w: [E, N, K]` bf16, or e4m3 `[E, N, K]` with scales
/// `[E, ceil(N/128), K/128]`.
pub(crate) fn small_m_grouped(
    k: &Kernels,
    x: &Tensor,
    w: Weight,
    routing: (&Tensor, &Tensor, &Tensor),
    out: &Tensor,
    row_div: usize,
    groups: usize,
) -> Result<()> {
    let (n, kd, fits) = w.matrix()?;
    if !fits {
        bail!("small_m_grouped: expert weights of [{n}, {kd}] per expert");
    }
    // A one-token step: each active expert has one pair.
    let one_row = out.dim(0)? == groups;
    run(k, x, w, out, Some(routing), [row_div as i32, 0, groups as i32, n as i32, kd as i32], one_row_if(one_row))
}

fn one_row_if(one_row: bool) -> Kernel {
    if one_row {
        Kernel::OneRow
    } else {
        Kernel::SmallM
    }
}

/// The gate|up product of a one-token MoE step with SiLU * up in its
/// epilogue: for the `groups` first active experts of `meta`, each with one
/// pair p, `act[p] = bf16(silu(gu[p, ..I])) * gu[p, I..]` where `gu[p] =
/// x[p / row_div] w[e]^T`, the same bits as [`small_m_grouped`] then
/// `silu_mul` (layers.rs) with one launch. `w: [E, 2I, K]` as
/// [`small_m_grouped`]'s; `act: [groups, I]`. False (nothing launched)
/// where the shape does not fit the kernel or a group has more than one
/// pair.
pub(crate) fn one_row_swiglu(
    k: &Kernels,
    x: &Tensor,
    w: Weight,
    routing: (&Tensor, &Tensor, &Tensor),
    act: &Tensor,
    row_div: usize,
    groups: usize,
) -> Result<bool> {
    let (n, kd, fits) = w.matrix()?;
    let (rows, i) = act.dims2()?;
    if !fits || rows != groups || 2 * i != n || x.dtype() != DType::BF16 {
        return Ok(false);
    }
    run(k, x, w, act, Some(routing), [row_div as i32, 0, groups as i32, n as i32, kd as i32], Kernel::OneRowSwiglu)?;
    Ok(true)
}

/// Whether the FP8 form takes a `[N, K]` e4m3 weight: N even, K a
/// multiple of 128 (a chunk of 16 inside one scale block).
pub(crate) fn fits_fp8(n: usize, k: usize) -> bool {
    fits(n, k) && k % 128 == 0
}

/// `x [M, K] @ dequant(q [N, K], scale)^T -> [M, N]` bf16 for small M, the
/// e4m3 weights and their 128x128 block scales read once, x in bf16 (no
/// activation quantization).
pub fn small_m_linear_fp8(k: &Kernels, x: &Tensor, q: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let (m, kd) = x.dims2()?;
    let (n, kw) = q.dims2()?;
    if kd != kw || !fits_fp8(n, kd) || x.dtype() != DType::BF16 || q.dtype() != DType::F8E4M3 {
        bail!("small_m_linear_fp8: x {:?} {:?}, w {:?} {:?}", x.shape(), x.dtype(), q.shape(), q.dtype());
    }
    let x = x.contiguous()?;
    let out = empty(cuda_dev(x.device())?, (m, n), DType::BF16)?;
    run(k, &x, Weight::Fp8 { q, scale }, &out, None, [1, m as i32, 1, n as i32, kd as i32], one_row_if(m == 1))?;
    Ok(out)
}

/// `silu_mul(x w^T)` for one row `x: [1, K]` and a gate|up weight `w: [2I,
/// K]` bf16 (gate rows, then up rows) in one launch: `[1, I]`, the same
/// bits as [`small_m_linear`] then `silu_mul` (the one-token experts'
/// fused kernel in its dense form, for tests and benchmarks).
pub fn swiglu_linear(k: &Kernels, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    swiglu_dense(k, x, Weight::Bf16(w))
}

/// [`swiglu_linear`] over block-FP8 weights (e4m3 `q: [2I, K]` and its
/// 128x128 block scales), as [`small_m_linear_fp8`] then `silu_mul`.
pub fn swiglu_linear_fp8(k: &Kernels, x: &Tensor, q: &Tensor, scale: &Tensor) -> Result<Tensor> {
    swiglu_dense(k, x, Weight::Fp8 { q, scale })
}

fn swiglu_dense(k: &Kernels, x: &Tensor, w: Weight) -> Result<Tensor> {
    let (m, kd) = x.dims2()?;
    let (n, kw, fits) = w.matrix()?;
    if m != 1 || kd != kw || !fits || x.dtype() != DType::BF16 {
        bail!("swiglu_linear: x {:?} {:?}, w [{n}, {kw}] (one row, 2I even, K a multiple of 8; of 128 for FP8)", x.shape(), x.dtype());
    }
    let x = x.contiguous()?;
    let out = empty(cuda_dev(x.device())?, (1, n / 2), DType::BF16)?;
    run(k, &x, w, &out, None, [1, 1, 1, n as i32, kd as i32], Kernel::OneRowSwiglu)?;
    Ok(out)
}
