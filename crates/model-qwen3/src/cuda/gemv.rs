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

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{bail, DType, Result, Tensor};

use super::{cuda_dev, empty, launch, ptr, Kernels};

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

/// `x [M, K] @ w [N, K]^T -> [M, N]` bf16, for small M.
pub fn small_m_linear(k: &Kernels, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, kd) = x.dims2()?;
    let (n, kw) = w.dims2()?;
    if kd != kw || !fits(n, kd) || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 {
        bail!("small_m_linear: x {:?} {:?}, w {:?} {:?}", x.shape(), x.dtype(), w.shape(), w.dtype());
    }
    let out = empty(cuda_dev(x.device())?, (m, n), DType::BF16)?;
    let (null, groups) = (0u64, 1i32);
    launch!(k.small_m_gemm, grid(k, n / 2), ptr(x)?, ptr(w)?, ptr(&out)?, null, null, null, 1i32, m as i32, groups, n as i32, kd as i32)?;
    Ok(out)
}

/// The experts' product for a routed batch: for the `groups` first active
/// experts of `meta` (moe.rs's routing) and each pair p of expert e
/// (`sorted[offsets[e]..offsets[e + 1]]`), `out[p] = x[p / row_div] w[e]^T`.
/// `w: [E, N, K]`.
pub(crate) fn small_m_grouped(
    k: &Kernels,
    x: &Tensor,
    w: &Tensor,
    routing: (&Tensor, &Tensor, &Tensor),
    out: &Tensor,
    row_div: usize,
    groups: usize,
) -> Result<()> {
    let (_, n, kd) = w.dims3()?;
    if !fits(n, kd) {
        bail!("small_m_grouped: expert weights {:?}", w.shape());
    }
    let (offsets, sorted, meta) = routing;
    let ptrs = [ptr(x)?, ptr(w)?, ptr(out)?, ptr(offsets)?, ptr(sorted)?, ptr(meta)?];
    let dims = [row_div as i32, 0, groups as i32, n as i32, kd as i32];
    launch!(
        k.small_m_gemm,
        grid(k, groups * n / 2),
        ptrs[0],
        ptrs[1],
        ptrs[2],
        ptrs[3],
        ptrs[4],
        ptrs[5],
        dims[0],
        dims[1],
        dims[2],
        dims[3],
        dims[4]
    )
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
    let (null, groups) = (0u64, 1i32);
    launch!(
        k.small_m_gemm_fp8,
        grid(k, n / 2),
        ptr(&x)?,
        ptr(q)?,
        ptr(scale)?,
        ptr(&out)?,
        null,
        null,
        null,
        1i32,
        m as i32,
        groups,
        n as i32,
        kd as i32
    )?;
    Ok(out)
}

/// [`small_m_grouped`] over block-FP8 experts `q: [E, N, K]` e4m3 with
/// `scale: [E, ceil(N/128), K/128]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn small_m_grouped_fp8(
    k: &Kernels,
    x: &Tensor,
    (q, scale): (&Tensor, &Tensor),
    routing: (&Tensor, &Tensor, &Tensor),
    out: &Tensor,
    row_div: usize,
    groups: usize,
) -> Result<()> {
    let (_, n, kd) = q.dims3()?;
    if !fits_fp8(n, kd) || q.dtype() != DType::F8E4M3 {
        bail!("small_m_grouped_fp8: expert weights {:?} {:?}", q.shape(), q.dtype());
    }
    let (offsets, sorted, meta) = routing;
    let (ptrs, dims) = (
        [ptr(x)?, ptr(q)?, ptr(scale)?, ptr(out)?, ptr(offsets)?, ptr(sorted)?, ptr(meta)?],
        [row_div as i32, 0, groups as i32, n as i32, kd as i32],
    );
    launch!(
        k.small_m_gemm_fp8,
        grid(k, groups * n / 2),
        ptrs[0],
        ptrs[1],
        ptrs[2],
        ptrs[3],
        ptrs[4],
        ptrs[5],
        ptrs[6],
        dims[0],
        dims[1],
        dims[2],
        dims[3],
        dims[4]
    )
}
