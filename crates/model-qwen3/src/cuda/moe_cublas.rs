//! The prefill-sized MoE GEMMs on cuBLAS's grouped GEMM
//! (`cublasGemmGroupedBatchedEx`, cuBLAS >= 12.5), one of the expert GEMMs
//! moe_gemm.rs chooses from (1.24x kvc's own tensor-core kernel at 8K
//! prefill on the H200, docs/benchmarks.md). cuBLAS needs each expert's
//! row count on the host: one small device-to-host copy (the expert
//! offsets) per MoE layer, which an eager step can afford and a CUDA graph
//! could not capture.

use std::ffi::{c_int, c_void};

use candle_core::cuda::cudarc::cublas::sys as cublas;
use candle_core::{bail, CudaDevice, Result, Tensor};

use super::ptr;

/// The expert offsets (`[E + 1]` on the device) on the host, checked.
pub(crate) fn host_offsets(offsets: &Tensor, experts: usize, pairs: usize) -> Result<Vec<u32>> {
    let offsets: Vec<u32> = offsets.to_vec1()?;
    if offsets.len() != experts + 1 || offsets[experts] as usize != pairs {
        bail!("moe: expert offsets {} for {experts} experts and {pairs} pairs", offsets.len());
    }
    Ok(offsets)
}

/// For every expert e with rows: `out[r] = a[r] W[e]^T` over its rows
/// `r in offsets[e]..offsets[e + 1]` (`a: [rows, K]`, `W: [E, N, K]`,
/// `out: [rows, N]`, all bf16 row-major), one cuBLAS call.
pub(crate) fn cublas_grouped(dev: &CudaDevice, offsets: &[u32], a: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
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
