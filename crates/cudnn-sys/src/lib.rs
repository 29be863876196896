//! cuDNN's fused attention (the frontend's SDPA graph) for kvc's prefill:
//! Q and O ragged over a varlen batch's token rows, K and V ragged or read
//! in place from the paged KV pool, causal with bottom-right alignment (a
//! chunk attends to its cached context), in bf16 or, over chunks without
//! cached context, e4m3 with per-tensor scales. A thin, safe layer over
//! cpp/sdpa.h; libcudnn is opened at run time, so binaries start without
//! it and the caller falls back to its own kernels.

use std::ffi::{c_char, c_void, CStr};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// cuDNN cannot be used at all (not built in, library missing).
    #[error("cuDNN unavailable: {0}")]
    Unavailable(String),
    /// cuDNN has no engine for this graph (shape, head dim, version).
    #[error("cuDNN does not support this attention graph: {0}")]
    Unsupported(String),
    #[error("cuDNN: {0}")]
    Cudnn(String),
}

/// The shape of one attention graph (cpp/sdpa.h's kvc_sdpa_desc).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SdpaDesc {
    pub b: i64,
    pub h_q: i64,
    pub h_kv: i64,
    pub d: i64,
    pub s_q: i64,
    pub s_kv: i64,
    pub paged: i32,
    pub num_blocks: i64,
    pub block_size: i64,
    pub block_stride: i64,
    pub table_len: i64,
    /// Bits of the f32 softmax scale (so the key hashes).
    pub scale_bits: u32,
    /// 1: e4m3 Q/K/V/O with per-tensor scales (gathered K/V, sequences
    /// without cached context: cuDNN's FP8 forward on Hopper aligns the
    /// causal mask top-left only); 0: bf16.
    pub fp8: i32,
}

/// Device pointers of one run (cpp/sdpa.h's kvc_sdpa_args); 0 where unused.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SdpaArgs {
    pub q: u64,
    pub o: u64,
    pub k: u64,
    pub v: u64,
    pub seq_len_q: u64,
    pub seq_len_kv: u64,
    pub q_offsets: u64,
    pub kv_offsets: u64,
    pub page_table: u64,
    pub workspace: u64,
    /// FP8: `f32[8]` on the device, [`Fp8Scales`]'s order.
    pub scales: u64,
}

/// The per-tensor scales of an FP8 run, in the order `SdpaArgs::scales`
/// holds them on the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Scales {
    /// What one e4m3 unit of Q, K and V is worth.
    pub descale_q: f32,
    pub descale_k: f32,
    pub descale_v: f32,
    /// O is written as e4m3(O x scale_o).
    pub scale_o: f32,
}

impl Fp8Scales {
    /// The softmax probabilities (in [0, 1]) as e4m3 x 1/448: 1.0 maps to
    /// e4m3's largest value, the most precision the format gives them.
    pub const SCALE_S: f32 = 448.0;

    /// The eight floats of `SdpaArgs::scales`: the six scales, then the
    /// two amax slots cuDNN writes.
    pub fn to_device_order(&self) -> [f32; 8] {
        [self.descale_q, self.descale_k, self.descale_v, 1.0 / Self::SCALE_S, Self::SCALE_S, self.scale_o, 0.0, 0.0]
    }
}

#[cfg_attr(not(kvc_cudnn), allow(dead_code))]
const ERR_LEN: usize = 2048;

fn message(buf: &[c_char]) -> String {
    // SAFETY: the shim writes a NUL-terminated string into the buffer (snprintf).
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

#[cfg(kvc_cudnn)]
mod ffi {
    use super::*;
    extern "C" {
        pub fn kvc_cudnn_open(ctx: *mut *mut c_void, err: *mut c_char, n: usize) -> i32;
        pub fn kvc_cudnn_version(ctx: *mut c_void) -> i64;
        pub fn kvc_cudnn_sdpa_build(
            ctx: *mut c_void,
            desc: *const SdpaDesc,
            graph: *mut *mut c_void,
            workspace: *mut i64,
            err: *mut c_char,
            n: usize,
        ) -> i32;
        pub fn kvc_cudnn_sdpa_run(
            ctx: *mut c_void,
            graph: *mut c_void,
            stream: *mut c_void,
            args: *const SdpaArgs,
            err: *mut c_char,
            n: usize,
        ) -> i32;
        pub fn kvc_cudnn_sdpa_free(graph: *mut c_void);
        pub fn kvc_cudnn_close(ctx: *mut c_void);
    }
}

/// A cuDNN handle on the current CUDA device.
#[cfg_attr(not(kvc_cudnn), allow(dead_code))]
pub struct Cudnn {
    ctx: *mut c_void,
    version: i64,
}

// SAFETY: the shim serialises every use of the handle with a mutex.
unsafe impl Send for Cudnn {}
unsafe impl Sync for Cudnn {}

/// A built execution plan for one [`SdpaDesc`].
#[cfg_attr(not(kvc_cudnn), allow(dead_code))]
pub struct SdpaGraph {
    ptr: *mut c_void,
    /// Device workspace bytes a run needs.
    pub workspace: usize,
}

// SAFETY: a built plan is immutable; runs go through the handle's mutex.
unsafe impl Send for SdpaGraph {}
unsafe impl Sync for SdpaGraph {}

impl Drop for SdpaGraph {
    fn drop(&mut self) {
        #[cfg(kvc_cudnn)]
        // SAFETY: made by kvc_cudnn_sdpa_build, freed once.
        unsafe {
            ffi::kvc_cudnn_sdpa_free(self.ptr)
        }
    }
}

impl Cudnn {
    /// Opens libcudnn (`KVC_CUDNN_LIB`, else `libcudnn.so.9` on the
    /// loader's path) and creates a handle. The CUDA context must be
    /// current on this thread.
    pub fn open() -> Result<Self, Error> {
        #[cfg(kvc_cudnn)]
        {
            let mut err = [0 as c_char; ERR_LEN];
            let mut ctx = std::ptr::null_mut();
            // SAFETY: out-pointers valid for the call.
            let rc = unsafe { ffi::kvc_cudnn_open(&mut ctx, err.as_mut_ptr(), ERR_LEN) };
            if rc != 0 {
                return Err(Error::Unavailable(message(&err)));
            }
            // SAFETY: ctx was just opened.
            let version = unsafe { ffi::kvc_cudnn_version(ctx) };
            Ok(Self { ctx, version })
        }
        #[cfg(not(kvc_cudnn))]
        {
            let _ = message;
            Err(Error::Unavailable(
                "kvc was built without cuDNN's headers (run scripts/cudnn_setup.sh, then rebuild with --features cuda)".into(),
            ))
        }
    }

    /// cuDNN's version number, e.g. 91900 for 9.19.0.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// Builds the execution plan of one graph shape (tens to hundreds of
    /// milliseconds: callers cache it).
    pub fn build(&self, desc: &SdpaDesc) -> Result<SdpaGraph, Error> {
        #[cfg(kvc_cudnn)]
        {
            let mut err = [0 as c_char; ERR_LEN];
            let (mut g, mut ws) = (std::ptr::null_mut(), 0i64);
            // SAFETY: pointers valid for the call; the shim copies desc.
            let rc = unsafe { ffi::kvc_cudnn_sdpa_build(self.ctx, desc, &mut g, &mut ws, err.as_mut_ptr(), ERR_LEN) };
            match rc {
                0 => Ok(SdpaGraph { ptr: g, workspace: ws.max(0) as usize }),
                1 => Err(Error::Unsupported(message(&err))),
                _ => Err(Error::Cudnn(message(&err))),
            }
        }
        #[cfg(not(kvc_cudnn))]
        {
            let _ = desc;
            Err(Error::Unavailable("built without cuDNN".into()))
        }
    }

    /// Enqueues a run of `graph` on `stream` (a CUstream).
    ///
    /// # Safety
    /// Every pointer in `args` must be a live device allocation of the
    /// size the graph's shape implies, on this handle's device, and stay
    /// so until the stream has run the work.
    pub unsafe fn run(&self, graph: &SdpaGraph, stream: *mut c_void, args: &SdpaArgs) -> Result<(), Error> {
        #[cfg(kvc_cudnn)]
        {
            let mut err = [0 as c_char; ERR_LEN];
            let rc = ffi::kvc_cudnn_sdpa_run(self.ctx, graph.ptr, stream, args, err.as_mut_ptr(), ERR_LEN);
            if rc != 0 {
                return Err(Error::Cudnn(message(&err)));
            }
            Ok(())
        }
        #[cfg(not(kvc_cudnn))]
        {
            let _ = (graph, stream, args);
            Err(Error::Unavailable("built without cuDNN".into()))
        }
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        #[cfg(kvc_cudnn)]
        // SAFETY: opened by kvc_cudnn_open, closed once.
        unsafe {
            ffi::kvc_cudnn_close(self.ctx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(kvc_cudnn))]
    #[test]
    fn a_build_without_headers_says_how_to_get_them() {
        let e = Cudnn::open().err().expect("no cuDNN in this build");
        assert!(e.to_string().contains("scripts/cudnn_setup.sh"), "{e}");
    }

    #[test]
    fn the_descriptor_matches_the_c_layout() {
        // kvc_sdpa_desc: 6 x i64, i32 (+4 padding), 4 x i64, f32, i32 = 96 bytes.
        assert_eq!(std::mem::size_of::<SdpaDesc>(), 96);
        assert_eq!(std::mem::offset_of!(SdpaDesc, fp8), 92);
        assert_eq!(std::mem::size_of::<SdpaArgs>(), 88);
    }
}
