//! FP8 GEMMs with block scales on Hopper (cpp/fp8_gemm.h), the recipe of
//! block-FP8 checkpoints such as Qwen3-30B-A3B-FP8 and DeepSeek-V3:
//!
//! * weights `e4m3 [n, k]` row-major with an f32 `weight_scale_inv` per
//!   128x128 block, `[ceil(n/128), k/128]` row-major: the checkpoint's own
//!   layout, used as is (no conversion at load);
//! * activations quantized on the fly per token and per 128-wide K group
//!   ([`quant_rows`]): `e4m3 [m, k]` plus f32 scales `[m, k/128]`
//!   row-major, `scale = max|x| / 448`;
//! * `d[m, n] = sum_kb (a_q . w_q^T over kb) * sa[m, kb] * sw[n/128, kb]`,
//!   f32 accumulation with the block scales applied per K block, bf16 out,
//!   through CUTLASS's sm90 blockwise-scaled FP8 kernels
//!   (`KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum`, 128x128x128
//!   tiles; a decode step's few tokens on a swapped 64x64 tiling,
//!   [`DenseTiling::Swap64`]), dense ([`dense_run`]) and grouped over experts
//!   ([`grouped_run`], the calling convention of [`crate::run`], in both of
//!   its tilings: rows on M, or the weights on M and a decode step's few
//!   rows per expert on N, 128x64x128).
//!
//! Every call only queues kernels (nothing is read back), so calls can be
//! captured in a CUDA graph. [`selftest_dense`] and [`selftest_grouped`]
//! check the kernels against a plain CUDA reference on the device and time
//! them against CUTLASS's bf16 GEMM.
//!
//! Built only where nvcc and CUTLASS's headers are; elsewhere every call
//! returns [`Error::Unavailable`].

#[cfg(kvc_cutlass)]
use std::ffi::c_char;
use std::ffi::c_void;

pub use crate::error::Error;
#[cfg(kvc_cutlass)]
use crate::error::{bytes, call, int, ERR_LEN};
pub use crate::Variant;

/// The dense GEMM's tilings (cpp/fp8_gemm.h's KVC_FP8_DENSE_*).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseTiling {
    /// The tokens on M, 128x128x128 tiles: prefill.
    #[default]
    Rows = 0,
    /// `d^T = w a^T`, 64 weight rows on M and up to 64 tokens on N a tile
    /// (ping-pong): a decode step's few tokens get twice the CTAs of
    /// `Rows` over the same weights. Its `sw` is the weights' scales at
    /// 64-row granularity, `[ceil(n/64), k/128]`: the 128-row ones with
    /// every row repeated.
    Swap64 = 1,
}

/// One dense call's operands (cpp/fp8_gemm.h's kvc_fp8_gemm_args), all
/// device addresses: `a: e4m3 [m, k]`, `sa: f32 [m, k/128]`,
/// `w: e4m3 [n, k]`, `sw: f32 [ceil(n/128), k/128]` (`[ceil(n/64), k/128]`
/// in [`DenseTiling::Swap64`]), `d: bf16 [m, n]`, all row-major. `n` a
/// multiple of 16, `k` of 128; `a`, `w`, `d` 16-byte aligned. `variant`
/// is a [`DenseTiling`] as i32.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DenseArgs {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub variant: i32,
    pub op: Operands,
}

/// The device operands of either GEMM (kvc_fp8_operands): `a` e4m3 rows,
/// `sa` their f32 group scales, `w` e4m3 weights, `sw` their block
/// scales, `d` the bf16 output, and `workspace_bytes` of device scratch at
/// `workspace` ([`dense_workspace_bytes`] / [`grouped_workspace_bytes`],
/// 256-byte aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Operands {
    pub a: u64,
    pub sa: u64,
    pub w: u64,
    pub sw: u64,
    pub d: u64,
    pub workspace: u64,
    pub workspace_bytes: u64,
}

/// One grouped call's operands (kvc_fp8_grouped_args): for every expert e
/// of `groups` ([`crate::Groups`]: rows on M, 128x128x128; or swapped, the
/// weights on M and the rows on N, 128x64x128), `d[r] = a_q[r] w_q[e]^T`
/// with the block scales, over its rows. `a: e4m3 [rows, k]`,
/// `sa: f32 [rows, k/128]`, `w: e4m3 [experts, n, k]`,
/// `sw: f32 [experts, ceil(n/128), k/128]`, `d: bf16 [rows, n]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupedArgs {
    pub groups: crate::Groups,
    pub op: Operands,
}

/// What a self-test measured (kvc_fp8_selftest_result).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SelfTest {
    /// `max |d - ref| / max |ref|`, the reference computed from the same
    /// quantized operands with f32 accumulation.
    pub max_rel_err: f64,
    /// `max |dequant(q) - x| / amax` of x's 128-group (at most 1/16 for
    /// e4m3's 3 mantissa bits).
    pub quant_err: f64,
    /// Mean microseconds per FP8 GEMM call.
    pub fp8_us: f64,
    /// Mean microseconds per call of CUTLASS's bf16 GEMM of the same shape
    /// (the faster of moe_gemm's two tilings).
    pub bf16_us: f64,
    /// Mean microseconds per [`quant_rows`] of the activations.
    pub quant_us: f64,
}

#[cfg(kvc_cutlass)]
mod ffi {
    use super::*;
    extern "C" {
        pub fn kvc_fp8_gemm_check(err: *mut c_char, n: usize) -> i32;
        pub fn kvc_fp8_quant_rows(x: u64, q: u64, s: u64, m: i32, k: i32, stream: *mut c_void, err: *mut c_char, n: usize) -> i32;
        pub fn kvc_fp8_quant_blocks(
            w: u64,
            q: u64,
            sw: u64,
            experts: i32,
            n: i32,
            k: i32,
            stream: *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        pub fn kvc_fp8_gemm_workspace(m: i32, n: i32, k: i32, variant: i32, bytes: *mut u64, err: *mut c_char, len: usize) -> i32;
        pub fn kvc_fp8_gemm_run(args: *const DenseArgs, stream: *mut c_void, err: *mut c_char, len: usize) -> i32;
        pub fn kvc_fp8_grouped_workspace(experts: i32, variant: i32, bytes: *mut u64, err: *mut c_char, len: usize) -> i32;
        pub fn kvc_fp8_grouped_run(args: *const GroupedArgs, stream: *mut c_void, err: *mut c_char, len: usize) -> i32;
        pub fn kvc_fp8_gemm_selftest_ex(
            m: i32,
            n: i32,
            k: i32,
            variant: i32,
            iters: i32,
            out: *mut SelfTest,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        pub fn kvc_fp8_grouped_selftest(
            experts: i32,
            tokens: i32,
            topk: i32,
            n: i32,
            k: i32,
            variant: i32,
            iters: i32,
            out: *mut SelfTest,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

/// Ok when the FP8 GEMMs are built in and the current device is sm90.
pub fn check() -> Result<(), Error> {
    shim!([], {
        // SAFETY: err is ERR_LEN bytes.
        call(|e| unsafe { ffi::kvc_fp8_gemm_check(e, ERR_LEN) }, Error::Unavailable)
    })
}

/// Queues the per-token, per-128-group quantization of `x: bf16 [m, k]`
/// into `q: e4m3 [m, k]` and `s: f32 [m, ceil(k/128)]` on `stream`.
///
/// # Safety
/// `x`, `q`, `s` must be live device allocations of those sizes in the
/// current context until the stream has run it.
pub unsafe fn quant_rows(x: u64, q: u64, s: u64, m: usize, k: usize, stream: *mut c_void) -> Result<(), Error> {
    shim!([x, q, s, m, k, stream], {
        let (m, k) = (int(m, "m")?, int(k, "k")?);
        call(|e| ffi::kvc_fp8_quant_rows(x, q, s, m, k, stream, e, ERR_LEN), Error::Cutlass)
    })
}

/// Queues the quantization of `experts` bf16 weights `w: [experts, n, k]`
/// as block-FP8 checkpoints are made (128x128 blocks, `sw = amax / 448`):
/// `q: e4m3 [experts, n, k]`, `sw: f32 [experts, ceil(n/128), ceil(k/128)]`.
///
/// # Safety
/// `w`, `q`, `sw` must be live device allocations of those sizes in the
/// current context until the stream has run it.
pub unsafe fn quant_blocks(w: u64, q: u64, sw: u64, experts: usize, n: usize, k: usize, stream: *mut c_void) -> Result<(), Error> {
    shim!([w, q, sw, experts, n, k, stream], {
        let (experts, n, k) = (int(experts, "experts")?, int(n, "n")?, int(k, "k")?);
        call(|e| ffi::kvc_fp8_quant_blocks(w, q, sw, experts, n, k, stream, e, ERR_LEN), Error::Cutlass)
    })
}

/// Device scratch bytes one dense call of this shape and tiling needs.
pub fn dense_workspace_bytes(m: usize, n: usize, k: usize, tiling: DenseTiling) -> Result<usize, Error> {
    shim!([m, n, k, tiling], {
        let (m, n, k) = (int(m, "m")?, int(n, "n")?, int(k, "k")?);
        // SAFETY: the byte count and err are valid for writes.
        bytes(|b, e| unsafe { ffi::kvc_fp8_gemm_workspace(m, n, k, tiling as i32, b, e, ERR_LEN) })
    })
}

/// Queues the dense FP8 GEMM on `stream` (a CUstream of the current context).
///
/// # Safety
/// Every address in `args` must point to live device memory of the sizes
/// described there, in the current context, until the stream has run it.
pub unsafe fn dense_run(args: &DenseArgs, stream: *mut c_void) -> Result<(), Error> {
    shim!([args, stream], { call(|e| ffi::kvc_fp8_gemm_run(args, stream, e, ERR_LEN), Error::Cutlass) })
}

/// Device scratch bytes one grouped call over `experts` groups in tiling
/// `variant` needs.
pub fn grouped_workspace_bytes(experts: usize, variant: Variant) -> Result<usize, Error> {
    shim!([experts, variant], {
        let experts = int(experts, "experts")?;
        // SAFETY: the byte count and err are valid for writes.
        bytes(|b, e| unsafe { ffi::kvc_fp8_grouped_workspace(experts, variant as i32, b, e, ERR_LEN) })
    })
}

/// Queues the grouped (per-expert) FP8 GEMM on `stream`.
///
/// # Safety
/// As [`dense_run`]: every address in `args` must be live device memory of
/// the described sizes until the stream has run it.
pub unsafe fn grouped_run(args: &GroupedArgs, stream: *mut c_void) -> Result<(), Error> {
    shim!([args, stream], { call(|e| ffi::kvc_fp8_grouped_run(args, stream, e, ERR_LEN), Error::Cutlass) })
}

/// Self-test of the dense path on the current device: quantizes
/// pseudo-random `[m, k]` activations and `[n, k]` weights, runs
/// [`dense_run`], compares with a plain CUDA reference over the same
/// quantized values, and times `iters` calls of it and of CUTLASS's bf16
/// GEMM of the same shape, in tiling `tiling` (the swap's 64-row scales
/// made from the 128-row ones on the device; the reference reads those).
/// Allocates and frees its own device memory.
pub fn selftest_dense(m: usize, n: usize, k: usize, tiling: DenseTiling, iters: usize) -> Result<SelfTest, Error> {
    shim!([m, n, k, tiling, iters], {
        let (m, n, k, iters) = (int(m, "m")?, int(n, "n")?, int(k, "k")?, int(iters, "iters")?);
        let mut out = SelfTest::default();
        // SAFETY: out and err are valid for writes; the shim owns its device memory.
        call(|e| unsafe { ffi::kvc_fp8_gemm_selftest_ex(m, n, k, tiling as i32, iters, &mut out, e, ERR_LEN) }, Error::Cutlass)?;
        Ok(out)
    })
}

/// Self-test of the grouped path: `tokens` tokens each routed to `topk`
/// distinct experts of `experts` (deterministic pseudo-random routing),
/// expert weights `[n, k]`, the GEMM in tiling `variant`; otherwise as
/// [`selftest_dense`] (the bf16 baseline is [`crate::run`] over the same
/// expert offsets, the faster of its tilings).
pub fn selftest_grouped(
    experts: usize,
    tokens: usize,
    topk: usize,
    n: usize,
    k: usize,
    variant: Variant,
    iters: usize,
) -> Result<SelfTest, Error> {
    shim!([experts, tokens, topk, n, k, variant, iters], {
        let (experts, tokens, topk) = (int(experts, "experts")?, int(tokens, "tokens")?, int(topk, "topk")?);
        let (n, k, iters) = (int(n, "n")?, int(k, "k")?, int(iters, "iters")?);
        let mut out = SelfTest::default();
        // SAFETY: out and err are valid for writes; the shim owns its device memory.
        call(
            |e| unsafe { ffi::kvc_fp8_grouped_selftest(experts, tokens, topk, n, k, variant as i32, iters, &mut out, e, ERR_LEN) },
            Error::Cutlass,
        )?;
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the CUDA build every entry says what is missing.
    #[cfg(not(kvc_cutlass))]
    #[test]
    fn a_build_without_cutlass_says_unavailable() {
        let e = check().unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        assert!(e.to_string().contains("scripts/cutlass_setup.sh"), "{e}");
        assert!(matches!(dense_workspace_bytes(1, 2048, 2048, DenseTiling::Rows), Err(Error::Unavailable(_))));
        assert!(matches!(grouped_workspace_bytes(128, Variant::Swap), Err(Error::Unavailable(_))));
        assert!(matches!(selftest_dense(1, 2048, 2048, DenseTiling::Swap64, 1), Err(Error::Unavailable(_))));
        assert!(matches!(selftest_grouped(128, 1, 8, 1536, 2048, Variant::Rows, 1), Err(Error::Unavailable(_))));
    }

    /// The C structs keep the layout cpp/fp8_gemm.h declares.
    #[test]
    fn the_argument_structs_match_the_c_layout() {
        assert_eq!(std::mem::size_of::<DenseArgs>(), 16 + 7 * 8);
        assert_eq!(std::mem::size_of::<GroupedArgs>(), 16 + 8 * 8);
        assert_eq!(std::mem::size_of::<SelfTest>(), 5 * 8);
    }
}
