//! Which grouped GEMM runs the MoE experts above the CUDA-core kernel's
//! batch sizes, and the pipeline the library GEMMs share.
//!
//! - `cutlass` (the default where it is built and the GPU is sm90):
//!   CUTLASS 3's Hopper grouped GEMM (crates/cutlass-sys: TMA, wgmma),
//!   every expert's row count read on the device, so nothing comes back to
//!   the host and CUDA graphs can hold it. Two tilings: `cutlass-rows`
//!   (rows on the tile's M, for prefill) and `cutlass-swap` (weights on M,
//!   a few rows on N, for decode and mixed steps); `cutlass` picks by rows
//!   per active expert ([`SWAP_BELOW_ROWS`]).
//! - `cublas`: cuBLAS's grouped GEMM (moe_cublas.rs), which needs the
//!   offsets on the host: one device-to-host copy per layer, never inside
//!   a graph (there the tensor-core kernel runs instead).
//! - `kvc`: kvc's own tensor-core kernel (moe.rs).
//!
//! The engine's kernel plan (kvc-policy's `kernel_plan`, which reads
//! `KVC_MOE_GEMM` once at start and refuses a CUTLASS route the device
//! cannot run) chooses through [`set_moe_gemm`]; tests and benchmarks
//! force each route the same way. Unset, the first MoE layer takes
//! CUTLASS where it runs, else cuBLAS.
//!
//! The library paths gather each pair's input row in expert order
//! (`gather_rows`), so every expert's rows are one contiguous matrix, run
//! gate/up, SiLU * up, down, and `moe_sum` reads the rows back through `inv`.

use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::{bail, CudaDevice, DType, Result, Tensor};
pub use cutlass_sys::Variant as CutlassTiling;

use super::layers::{silu_mul, Form, MoeRows};
use super::{empty, ptr, Kernels};

/// The expert GEMM for prefill-sized batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeGemm {
    /// kvc's tensor-core kernel.
    Kvc,
    /// cuBLAS's grouped GEMM (host offsets; eager steps only).
    Cublas,
    /// CUTLASS's Hopper grouped GEMM; `None`: the tiling by rows per expert.
    Cutlass(Option<CutlassTiling>),
}

/// Below this many routed rows per active expert, `cutlass` tiles with the
/// weights on M (`cutlass-swap`).
pub const SWAP_BELOW_ROWS: usize = 64;

/// 0: not chosen yet; else `encode`.
static CHOICE: AtomicU8 = AtomicU8::new(0);

fn encode(g: MoeGemm) -> u8 {
    match g {
        MoeGemm::Kvc => 1,
        MoeGemm::Cublas => 2,
        MoeGemm::Cutlass(None) => 3,
        MoeGemm::Cutlass(Some(CutlassTiling::Rows)) => 4,
        MoeGemm::Cutlass(Some(CutlassTiling::Swap)) => 5,
    }
}

fn decode(v: u8) -> Option<MoeGemm> {
    Some(match v {
        1 => MoeGemm::Kvc,
        2 => MoeGemm::Cublas,
        3 => MoeGemm::Cutlass(None),
        4 => MoeGemm::Cutlass(Some(CutlassTiling::Rows)),
        5 => MoeGemm::Cutlass(Some(CutlassTiling::Swap)),
        _ => return None,
    })
}

/// Whether CUTLASS's sm90 grouped GEMM runs on this device (Err: why not).
pub fn cutlass_runs() -> std::result::Result<(), String> {
    cutlass_sys::check().map_err(|e| e.to_string())
}

/// Chooses the expert GEMM (tests and benchmarks force each in turn).
pub fn set_moe_gemm(g: MoeGemm) {
    CHOICE.store(encode(g), Ordering::Relaxed);
}

/// The current choice: the one set (by the engine's kernel plan, a test
/// or a benchmark), else CUTLASS where it runs, else cuBLAS.
pub fn moe_gemm() -> Result<MoeGemm> {
    if let Some(g) = decode(CHOICE.load(Ordering::Relaxed)) {
        return Ok(g);
    }
    let g = match cutlass_runs() {
        Ok(()) => MoeGemm::Cutlass(None),
        Err(e) => {
            tracing::info!(reason = %e, "MoE experts on cuBLAS's grouped GEMM");
            MoeGemm::Cublas
        }
    };
    set_moe_gemm(g);
    Ok(g)
}

/// The tiling `cutlass` takes for `pairs` routed rows over `experts`.
pub fn cutlass_tiling(pairs: usize, experts: usize) -> CutlassTiling {
    if pairs < SWAP_BELOW_ROWS * experts.min(pairs).max(1) {
        CutlassTiling::Swap
    } else {
        CutlassTiling::Rows
    }
}

/// The expert part of the MoE block over gathered rows: `pairs` routed by
/// `moe_align` (`sorted`, `inv`), weighted by `w`, each projection run by
/// `gemm(a, weights, out)` (every expert's rows contiguous in `a`,
/// gate|up `i2` rows wide): each pair's row, to be weighted and summed
/// ([`MoeRows`]). The FP8 experts gather their
/// rows after quantizing them instead (moe.rs's `Fp8Moe`) and share
/// [`experts_down`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gathered_experts<W>(
    k: &Kernels,
    dev: &CudaDevice,
    x: &Tensor,
    gate_up: &W,
    down: &W,
    i2: usize,
    sorted: &Tensor,
    inv: &Tensor,
    w: &Tensor,
    top_k: usize,
    mut gemm: impl FnMut(&Tensor, &W, &Tensor) -> Result<()>,
) -> Result<MoeRows> {
    let (t, h) = x.dims2()?;
    let tk = t * top_k;
    let xs = super::gather_rows(k, x, sorted, top_k, tk)?;
    let gu = empty(dev, (tk, i2), DType::BF16)?;
    gemm(&xs, gate_up, &gu)?;
    experts_down(dev, &gu, (t, h), w, inv, top_k, |gu, dn| gemm(&silu_mul(k, gu, Form::Auto)?, down, dn))
}

/// The rest of the MoE block after its gate|up projection `gu: [T k, 2I]`
/// (rows in expert order): SiLU * up and the down projection into
/// `[T k, H]` by `down(gu, out)`, its rows weighted and summed back into
/// token order (`inv`) by the caller ([`MoeRows`]); `(t, h)` = (T, H).
pub(crate) fn experts_down(
    dev: &CudaDevice,
    gu: &Tensor,
    (t, h): (usize, usize),
    w: &Tensor,
    inv: &Tensor,
    top_k: usize,
    down: impl FnOnce(&Tensor, &Tensor) -> Result<()>,
) -> Result<MoeRows> {
    let dn = empty(dev, (gu.dim(0)?, h), DType::BF16)?;
    down(gu, &dn)?;
    Ok(MoeRows { rows: dn, w: w.clone(), inv: Some(inv.clone()), top_k, tokens: t })
}

/// For every expert e: `out[r] = a[r] W[e]^T` over its rows
/// `offsets[e]..offsets[e + 1]` (offsets on the device), on CUTLASS.
pub(crate) fn cutlass_grouped(
    dev: &CudaDevice,
    offsets: &Tensor,
    a: &Tensor,
    w: &Tensor,
    out: &Tensor,
    tiling: CutlassTiling,
) -> Result<()> {
    let (e, n, kd) = w.dims3()?;
    let err = |e: cutlass_sys::Error| candle_core::Error::Msg(e.to_string());
    let bytes = cutlass_sys::workspace_bytes(e, tiling).map_err(err)?;
    // u32 words; freed in stream order after the GEMM has used it.
    let ws = empty(dev, bytes.div_ceil(4).max(64), DType::U32)?;
    let args = cutlass_sys::GroupedArgs {
        groups: cutlass_sys::Groups::new(ptr(offsets)?, (e, n, kd), tiling).map_err(err)?,
        a: ptr(a)?,
        w: ptr(w)?,
        d: ptr(out)?,
        workspace: ptr(&ws)?,
        workspace_bytes: (bytes.div_ceil(4).max(64) * 4) as u64,
    };
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    // SAFETY: every address is a live contiguous tensor of the sizes in
    // `args` on this device; the stream orders their frees after the GEMM.
    unsafe { cutlass_sys::run(&args, stream.cu_stream() as *mut std::ffi::c_void) }.map_err(err)
}

/// One grouped projection over rows already in expert order, as the MoE
/// block runs it (benchmarks): `out[r] = a[r] W[e]^T` for every expert's
/// rows `offsets[e]..offsets[e + 1]`. cuBLAS reads the offsets back to the
/// host first, as the block does; kvc's kernel needs the routing's tile
/// table, so it is measured through `GpuMoe::forward` only.
pub fn grouped_projection(gemm: MoeGemm, offsets: &Tensor, a: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    let dev = super::cuda_dev(a.device())?;
    let (e, _, _) = w.dims3()?;
    let rows = a.dim(0)?;
    match gemm {
        MoeGemm::Cutlass(t) => cutlass_grouped(dev, offsets, a, w, out, t.unwrap_or_else(|| cutlass_tiling(rows, e))),
        MoeGemm::Cublas => super::moe_cublas::cublas_grouped(dev, &super::moe_cublas::host_offsets(offsets, e, rows)?, a, w, out),
        MoeGemm::Kvc => bail!("kvc's tensor-core kernel takes the routing's tile table: measure it through GpuMoe::forward"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (The spellings are kvc-policy's kernel_plan's to parse and test.)
    #[test]
    fn every_choice_survives_its_encoding() {
        for g in [
            MoeGemm::Kvc,
            MoeGemm::Cublas,
            MoeGemm::Cutlass(None),
            MoeGemm::Cutlass(Some(CutlassTiling::Rows)),
            MoeGemm::Cutlass(Some(CutlassTiling::Swap)),
        ] {
            assert_eq!(decode(encode(g)), Some(g));
        }
    }

    #[test]
    fn few_rows_per_expert_take_the_swapped_tiling() {
        // Decode of 8 sequences, top-8 over 128 experts: ~1 row an expert.
        assert_eq!(cutlass_tiling(64, 128), CutlassTiling::Swap);
        // An 8K prefill: 512 rows an expert.
        assert_eq!(cutlass_tiling(65536, 128), CutlassTiling::Rows);
        assert_eq!(cutlass_tiling(SWAP_BELOW_ROWS * 128, 128), CutlassTiling::Rows);
        assert_eq!(cutlass_tiling(SWAP_BELOW_ROWS * 128 - 1, 128), CutlassTiling::Swap);
    }
}
