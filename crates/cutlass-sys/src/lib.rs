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

#[cfg(kvc_cutlass)]
use std::ffi::c_char;
use std::ffi::c_void;

#[macro_use]
mod error;
pub mod fp8;

use error::int;
pub use error::Error;
#[cfg(kvc_cutlass)]
use error::{bytes, call, ERR_LEN};

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

/// The experts of a grouped call, bf16 or FP8 (cpp/moe_gemm.h's
/// kvc_expert_groups): expert e's rows are `offsets[e]..offsets[e+1]`
/// (`offsets`: the device address of `experts + 1` u32), its weights
/// `[n, k]`, the GEMM in tiling `variant`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Groups {
    pub experts: i32,
    pub n: i32,
    pub k: i32,
    pub variant: i32,
    pub offsets: u64,
}

impl Groups {
    /// `experts` groups of `[n, k]` weights over the row offsets at
    /// `offsets`, in tiling `variant`.
    pub fn new(offsets: u64, (experts, n, k): (usize, usize, usize), variant: Variant) -> Result<Self, Error> {
        Ok(Self { experts: int(experts, "experts")?, n: int(n, "n")?, k: int(k, "k")?, variant: variant as i32, offsets })
    }
}

/// One call's operands (cpp/moe_gemm.h's kvc_moe_gemm_args): for every
/// expert e of `groups`, `d[r] = a[r] w[e]^T` over its rows.
/// `a: [rows, k]`, `w: [experts, n, k]`, `d: [rows, n]`, bf16 row-major;
/// all device addresses, 16-byte aligned.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GroupedArgs {
    pub groups: Groups,
    pub a: u64,
    pub w: u64,
    pub d: u64,
    /// [`workspace_bytes`] of device scratch, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: u64,
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
    shim!([], {
        // SAFETY: err is ERR_LEN bytes.
        call(|e| unsafe { ffi::kvc_moe_gemm_check(e, ERR_LEN) }, Error::Unavailable)
    })
}

/// Device scratch bytes one call over `experts` groups needs.
pub fn workspace_bytes(experts: usize, variant: Variant) -> Result<usize, Error> {
    shim!([experts, variant], {
        let experts = int(experts, "experts")?;
        // SAFETY: the byte count and err are valid for writes.
        bytes(|b, e| unsafe { ffi::kvc_moe_gemm_workspace(experts, variant as i32, b, e, ERR_LEN) })
    })
}

/// Queues the grouped GEMM on `stream` (a CUstream of the current context).
///
/// # Safety
/// Every address in `args` must point to live device memory of the sizes
/// described there, in the current context, until the stream has run it.
pub unsafe fn run(args: &GroupedArgs, stream: *mut c_void) -> Result<(), Error> {
    shim!([args, stream], { call(|e| ffi::kvc_moe_gemm_run(args, stream, e, ERR_LEN), Error::Cutlass) })
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

    /// The C structs keep the layout cpp/moe_gemm.h declares, and the
    /// groups' sizes are checked, not truncated.
    #[test]
    fn groups_match_the_c_layout_and_refuse_sizes_past_i32() {
        assert_eq!(std::mem::size_of::<Groups>(), 16 + 8);
        assert_eq!(std::mem::size_of::<GroupedArgs>(), 16 + 8 + 5 * 8);
        let g = Groups::new(64, (128, 1536, 2048), Variant::Swap).unwrap();
        assert_eq!((g.experts, g.n, g.k, g.variant, g.offsets), (128, 1536, 2048, 1, 64));
        let e = Groups::new(0, (128, 1 << 31, 2048), Variant::Rows).unwrap_err().to_string();
        assert!(e.contains("n = 2147483648"), "{e}");
    }
}
