//! The MoE expert GEMMs on CUTLASS 3's Hopper grouped GEMM (TMA, wgmma,
//! warp-specialized persistent kernels), one group per expert, every
//! expert's row count read from device memory: a call queues two kernels
//! and reads nothing back, so it can run inside a CUDA graph. A thin, safe
//! layer over cpp/moe_gemm.h.
//!
//! Built only where nvcc and CUTLASS's headers are (scripts/cuda_setup.sh,
//! scripts/cutlass_setup.sh); elsewhere [`check`] says what is missing.
//!
//! [`fp8`] holds the block-scaled FP8 GEMMs (dense and grouped) of the
//! same library (cpp/fp8_gemm.h).

use std::ffi::{c_char, c_void, CStr};

pub mod fp8;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The grouped GEMM cannot be used here (not built in, not sm90).
    #[error("CUTLASS grouped GEMM unavailable: {0}")]
    Unavailable(String),
    #[error("CUTLASS grouped GEMM: {0}")]
    Cutlass(String),
}

/// How the routed rows meet the tile (cpp/moe_gemm.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Rows on the tile's M (128x256x64): prefill-sized groups.
    Rows = 0,
    /// `d^T = w a^T`: the weight rows on M, the few routed rows on N
    /// (128x64x128): decode and mixed steps, where each touched expert's
    /// weights should stream once.
    Swap = 1,
}

/// One call's operands (cpp/moe_gemm.h's kvc_moe_gemm_args): for every
/// expert e, `d[r] = a[r] w[e]^T` over its rows `offsets[e]..offsets[e+1]`.
/// `a: [rows, k]`, `w: [experts, n, k]`, `d: [rows, n]`, bf16 row-major,
/// `offsets`: `experts + 1` u32; all device addresses, 16-byte aligned.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GroupedArgs {
    pub experts: i32,
    pub n: i32,
    pub k: i32,
    pub variant: i32,
    pub offsets: u64,
    pub a: u64,
    pub w: u64,
    pub d: u64,
    /// [`workspace_bytes`] of device scratch, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: u64,
}

#[cfg_attr(not(kvc_cutlass), allow(dead_code))]
const ERR_LEN: usize = 1024;

#[cfg_attr(not(kvc_cutlass), allow(dead_code))]
fn message(buf: &[c_char]) -> String {
    // SAFETY: the shim writes a NUL-terminated string (snprintf) or leaves the zeroed buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

#[cfg(kvc_cutlass)]
mod ffi {
    use super::*;
    extern "C" {
        pub fn kvc_moe_gemm_check(err: *mut c_char, n: usize) -> i32;
        pub fn kvc_moe_gemm_workspace(experts: i32, variant: i32, bytes: *mut u64, err: *mut c_char, n: usize) -> i32;
        pub fn kvc_moe_gemm_run(args: *const GroupedArgs, stream: *mut c_void, err: *mut c_char, n: usize) -> i32;
    }
}

/// Ok when the grouped GEMM is built in and the current device is sm90.
pub fn check() -> Result<(), Error> {
    #[cfg(kvc_cutlass)]
    {
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: err is ERR_LEN bytes.
        if unsafe { ffi::kvc_moe_gemm_check(err.as_mut_ptr(), ERR_LEN) } != 0 {
            return Err(Error::Unavailable(message(&err)));
        }
        Ok(())
    }
    #[cfg(not(kvc_cutlass))]
    Err(Error::Unavailable("kvc was built without CUTLASS's headers (scripts/cutlass_setup.sh, then scripts/cuda_setup.sh)".into()))
}

/// Device scratch bytes one call over `experts` groups needs.
pub fn workspace_bytes(experts: usize, variant: Variant) -> Result<usize, Error> {
    #[cfg(kvc_cutlass)]
    {
        let mut err = [0 as c_char; ERR_LEN];
        let mut bytes = 0u64;
        let e = i32::try_from(experts).map_err(|_| Error::Cutlass(format!("{experts} experts")))?;
        // SAFETY: bytes and err are valid for writes.
        if unsafe { ffi::kvc_moe_gemm_workspace(e, variant as i32, &mut bytes, err.as_mut_ptr(), ERR_LEN) } != 0 {
            return Err(Error::Cutlass(message(&err)));
        }
        Ok(bytes as usize)
    }
    #[cfg(not(kvc_cutlass))]
    {
        let _ = (experts, variant);
        check().map(|_| 0)
    }
}

/// Queues the grouped GEMM on `stream` (a CUstream of the current context).
///
/// # Safety
/// Every address in `args` must point to live device memory of the sizes
/// described there, in the current context, until the stream has run it.
pub unsafe fn run(args: &GroupedArgs, stream: *mut c_void) -> Result<(), Error> {
    #[cfg(kvc_cutlass)]
    {
        let mut err = [0 as c_char; ERR_LEN];
        if ffi::kvc_moe_gemm_run(args, stream, err.as_mut_ptr(), ERR_LEN) != 0 {
            return Err(Error::Cutlass(message(&err)));
        }
        Ok(())
    }
    #[cfg(not(kvc_cutlass))]
    {
        let _ = (args, stream);
        check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the CUDA build the crate says what is missing instead of
    /// pretending (CPU builds and CI).
    #[cfg(not(kvc_cutlass))]
    #[test]
    fn a_build_without_cutlass_names_the_setup_script() {
        let e = check().unwrap_err().to_string();
        assert!(e.contains("scripts/cutlass_setup.sh"), "{e}");
        assert!(workspace_bytes(128, Variant::Rows).is_err());
    }
}
