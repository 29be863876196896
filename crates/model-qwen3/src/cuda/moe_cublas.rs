//! The prefill-sized MoE GEMMs on cuBLAS's grouped GEMM
//! (`cublasGemmGroupedBatchedEx`, cuBLAS >= 12.5), an alternative to kvc's
//! own tensor-core kernel (`moe_gemm_tc`, wmma tiles at 6-10 % of peak in
//! docs/benchmarks.md): 1.24x faster at 8K prefill on the H200, so the
//! default; `KVC_MOE_GEMM=kvc` or [`set_moe_prefill_cublas`] picks kvc's
//! kernel.
//!
//! The pairs' input rows are first gathered in expert order (`gather_rows`),
//! so each expert's rows are one contiguous matrix; each GEMM then writes
//! its rows in that order and `moe_sum` reads them back through `inv`.
//! cuBLAS needs each expert's row count on the host: one small device-to-
//! host copy (the expert offsets) per MoE layer, which a prefill step can
//! afford and a CUDA graph could not capture.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::cuda::cudarc::cublas::sys as cublas;
use candle_core::{bail, CudaDevice, DType, Result, Tensor};

use super::moe::silu_mul;
use super::{empty, launch, ptr, Kernels};

/// 0: not read yet, 1: kvc's kernel, 2: cuBLAS.
static PREFILL_CUBLAS: AtomicU8 = AtomicU8::new(0);

/// Chooses cuBLAS's grouped GEMM (true, the default) or kvc's tensor-core
/// kernel for prefill-sized MoE batches (tests force each in turn;
/// `KVC_MOE_GEMM=kvc` picks kvc's kernel).
pub fn set_moe_prefill_cublas(on: bool) {
    PREFILL_CUBLAS.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether `pairs` routed pairs go to cuBLAS (prefill-sized batches:
/// more pairs than the CUDA-core kernel takes).
pub(crate) fn use_cublas(pairs: usize) -> bool {
    let on = match PREFILL_CUBLAS.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("KVC_MOE_GEMM").map_or(true, |v| v != "kvc");
            set_moe_prefill_cublas(on);
            on
        }
        v => v == 2,
    };
    on && pairs > super::moe::small_pairs()
}

/// The expert part of the MoE block for `tk` pairs routed by `moe_align`
/// (`offsets [E + 1]`, `sorted`, `inv`), weighted by `w`: `[T, H]` bf16.
#[allow(clippy::too_many_arguments)]
pub(crate) fn experts(
    k: &Kernels,
    dev: &CudaDevice,
    x: &Tensor,
    gate_up: &Tensor,
    down: &Tensor,
    offsets: &Tensor,
    sorted: &Tensor,
    inv: &Tensor,
    w: &Tensor,
    top_k: usize,
) -> Result<Tensor> {
    let (t, h) = x.dims2()?;
    let (e, i2, _) = gate_up.dims3()?;
    let tk = t * top_k;
    let offsets: Vec<u32> = offsets.to_vec1()?;
    if offsets.len() != e + 1 || offsets[e] as usize != tk {
        bail!("moe: expert offsets {} for {e} experts and {tk} pairs", offsets.len());
    }
    let xs = super::gather_rows(k, x, sorted, top_k, tk)?;
    let gu = empty(dev, (tk, i2), DType::BF16)?;
    grouped_gemm(dev, &offsets, &xs, gate_up, &gu)?;
    let act = silu_mul(k, &gu)?;
    let dn = empty(dev, (tk, h), DType::BF16)?;
    grouped_gemm(dev, &offsets, &act, down, &dn)?;
    let y = empty(dev, (t, h), DType::BF16)?;
    launch!(k.moe_sum, super::grid1(t * h, 256), ptr(&dn)?, ptr(w)?, ptr(inv)?, ptr(&y)?, t as i32, top_k as i32, h as i32)?;
    Ok(y)
}

/// For every expert e with rows: `out[r] = a[r] W[e]^T` over its rows
/// `r in offsets[e]..offsets[e + 1]` (`a: [rows, K]`, `W: [E, N, K]`,
/// `out: [rows, N]`, all bf16 row-major), one cuBLAS call.
fn grouped_gemm(dev: &CudaDevice, offsets: &[u32], a: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    let (_, n, kd) = w.dims3()?;
    let (a_base, w_base, o_base) = (ptr(a)?, ptr(w)?, ptr(out)?);
    let (mut pa, mut pw, mut po, mut rows) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (e, span) in offsets.windows(2).enumerate() {
        let (r0, cnt) = (span[0] as u64, (span[1] - span[0]) as c_int);
        if cnt == 0 {
            continue;
        }
        pw.push(w_base + (e * n * kd * 2) as u64);
        pa.push(a_base + r0 * (kd * 2) as u64);
        po.push(o_base + r0 * (n * 2) as u64);
        rows.push(cnt);
    }
    let groups = rows.len();
    if groups == 0 {
        return Ok(());
    }
    // Row-major out[rows, N] = a[rows, K] W[N, K]^T is column-major
    // out^T[N, rows] = W^T' a^T: op(A) = W transposed (stored K x N, ld K),
    // op(B) = a (stored K x rows, ld K), C ld N.
    let transa = vec![cublas::cublasOperation_t::CUBLAS_OP_T; groups];
    let transb = vec![cublas::cublasOperation_t::CUBLAS_OP_N; groups];
    let m = vec![n as c_int; groups];
    let k = vec![kd as c_int; groups];
    let (alpha, beta) = (vec![1f32; groups], vec![0f32; groups]);
    let (lda, ldb, ldc) = (vec![kd as c_int; groups], vec![kd as c_int; groups], vec![n as c_int; groups]);
    let group_size = vec![1 as c_int; groups];
    let stream = dev.cuda_stream();
    // The pointer arrays live on the device; freed after the call is queued
    // (stream-ordered, so after the GEMM has read them).
    let d_w = stream.clone_htod(&pw).map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    let d_a = stream.clone_htod(&pa).map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    let d_o = stream.clone_htod(&po).map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    let blas = dev.cublas_handle();
    let dptr = |s: &candle_core::cuda::cudarc::driver::CudaSlice<u64>| {
        use candle_core::cuda::cudarc::driver::DevicePtr;
        let (p, _sync) = s.device_ptr(&stream);
        p
    };
    // SAFETY: every array holds `groups` entries; the pointer arrays are
    // device memory of `groups` u64 addresses into live tensors.
    let status = unsafe {
        cublas::cublasGemmGroupedBatchedEx(
            *blas.handle(),
            transa.as_ptr(),
            transb.as_ptr(),
            m.as_ptr(),
            rows.as_ptr(),
            k.as_ptr(),
            alpha.as_ptr() as *const c_void,
            dptr(&d_w) as *const *const c_void,
            cublas::cudaDataType_t::CUDA_R_16BF,
            lda.as_ptr(),
            dptr(&d_a) as *const *const c_void,
            cublas::cudaDataType_t::CUDA_R_16BF,
            ldb.as_ptr(),
            beta.as_ptr() as *const c_void,
            dptr(&d_o) as *const *mut c_void,
            cublas::cudaDataType_t::CUDA_R_16BF,
            ldc.as_ptr(),
            groups as c_int,
            group_size.as_ptr(),
            cublas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    };
    if status != cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        bail!("cublasGemmGroupedBatchedEx: {status:?}");
    }
    Ok(())
}
