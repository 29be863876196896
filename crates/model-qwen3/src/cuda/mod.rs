//! The CUDA forward pass: candle for GEMMs (cuBLAS) and copies, kvc's own
//! kernels (kernels/*.cu, PTX embedded at build time) for everything that
//! candle does slowly: norms, RoPE, paged K/V writes, paged attention, MoE
//! routing and the grouped expert GEMM for small batches.

mod attention;
mod cudnn_attention;
mod cudnn_fp8;
mod fp8_linear;
mod gemv;
mod graph;
mod layers;
mod model;
mod moe;
mod moe_cublas;
mod moe_gemm;

pub use attention::{set_decode_kernel_v1, AttentionPlan, PagedAttention};
pub use cudnn_attention::{CudnnAttention, PrefillBackend, PrefillContext};
pub use cudnn_fp8::{e4m3_io_plans, fp8_attention_bounds, q_absmax, quantize_q, set_fp8_attention_bounds, E4m3Output, DEFAULT_FP8_BOUNDS};
pub use fp8_linear::{
    fp8_gemm_runs, fp8_weights, quantize_blocks, quantize_rows, set_fp8_dense_swap_rows, set_fp8_weights, silu_mul_quantized, Fp8Weight,
    GpuLinear, WeightBytes,
};
pub use gemv::{small_m_linear, small_m_linear_fp8, swiglu_linear, swiglu_linear_fp8};
pub use graph::CapturedStep;
pub(crate) use graph::DecodeGraphs;
pub use kvc_policy::fp8_attention::Fp8AttentionBounds;
pub use layers::{add_rmsnorm, moe_sum, moe_sum_add_rmsnorm, silu_mul, Form, MoeRows, RopeStore};
pub(crate) use model::GpuModel;
pub use moe::{set_moe_small_pairs, Fp8Moe, GpuMoe, SMALL_PAIRS, SMALL_PAIRS_CUTLASS};
pub use moe_gemm::{cutlass_runs, cutlass_tiling, grouped_projection, moe_gemm, set_moe_gemm, CutlassTiling, MoeGemm, SWAP_BELOW_ROWS};

use std::sync::Arc;

use candle_core::cuda::cudarc::driver::{sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchArgs, LaunchConfig};
use candle_core::cuda::WrapErr;
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Device, Result, Shape, Storage, Tensor};
use half::bf16;

pub(crate) const PTX_LAYERS: &str = include_str!(concat!(env!("OUT_DIR"), "/layers.ptx"));
pub(crate) const PTX_ATTENTION: &str = include_str!(concat!(env!("OUT_DIR"), "/attention.ptx"));
pub(crate) const PTX_MOE: &str = include_str!(concat!(env!("OUT_DIR"), "/moe.ptx"));
pub(crate) const PTX_GEMV: &str = include_str!(concat!(env!("OUT_DIR"), "/gemv.ptx"));

/// Launches `$f` with `$cfg` and the listed arguments (u64 device
/// pointers, i32, f32), in order; `launch!(f, cfg; extra, ...)` appends
/// the f32s of the slice `extra` (a cache format's scales).
macro_rules! launch {
    ($f:expr, $cfg:expr; $extra:expr $(, $a:expr)* $(,)?) => {{
        #[allow(unused_imports)]
        use candle_core::cuda::cudarc::driver::PushKernelArg;
        let mut b = $f.builder();
        $( let v = $a; b.arg(&v); )*
        let extra: &[f32] = $extra;
        for v in extra {
            b.arg(v);
        }
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(|e| candle_core::Error::Msg(format!("kernel launch: {e:?}")))
    }};
    ($f:expr, $cfg:expr $(, $a:expr)* $(,)?) => {
        launch!($f, $cfg; &[] $(, $a)*)
    };
}
pub(crate) use launch;

/// Launches `f` with `cfg` and its arguments in three runs: device
/// pointers, then i32s, then f32s (kernels whose pointer list varies).
pub(crate) fn launch_slices(f: &CudaFunc, cfg: LaunchConfig, ptrs: &[u64], ints: &[i32], floats: &[f32]) -> Result<()> {
    use candle_core::cuda::cudarc::driver::PushKernelArg;
    let mut b = f.builder();
    for p in ptrs {
        b.arg(p);
    }
    for i in ints {
        b.arg(i);
    }
    for x in floats {
        b.arg(x);
    }
    // SAFETY: the callers pass live device pointers and the sizes their
    // kernel's signature takes, in its order.
    unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| candle_core::Error::Msg(format!("kernel launch: {e:?}")))
}

/// One loaded kernel and the stream it runs on (candle's).
pub struct CudaFunc {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl CudaFunc {
    pub fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

/// What one layer of the KV pool holds, as kvc's kernels read and write it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheFormat {
    Bf16,
    /// e4m3 of K / k_scale and V / v_scale (`--kv-cache-dtype fp8`).
    Fp8 {
        k_scale: f32,
        v_scale: f32,
    },
}

impl CacheFormat {
    /// Layer `layer` of `kv`'s pool.
    pub fn of(kv: &kvc_kv_pool::KvStorage, layer: usize) -> Result<Self> {
        match kv.layout().dtype {
            DType::BF16 => Ok(Self::Bf16),
            DType::F8E4M3 => {
                let (k_scale, v_scale) = kv.kv_scales(layer);
                Ok(Self::Fp8 { k_scale, v_scale })
            }
            other => bail!("kvc's CUDA kernels read a bf16 or e4m3 (fp8) KV pool, not {other:?}"),
        }
    }

    /// The arguments its kernels take after the common ones.
    pub fn scale_args(&self) -> Vec<f32> {
        match *self {
            Self::Bf16 => Vec::new(),
            Self::Fp8 { k_scale, v_scale } => vec![k_scale, v_scale],
        }
    }

    /// Bytes of one element.
    pub fn elem_bytes(&self) -> usize {
        match self {
            Self::Bf16 => 2,
            Self::Fp8 { .. } => 1,
        }
    }
}

/// The kernels that write or read the KV pool, for one cache format.
pub struct CacheKernels {
    pub qk_norm_rope_store: CudaFunc,
    /// `qk_norm_rope_store` with vector accesses, by head dim (64, 128, 256).
    pub qk_norm_rope_store_vec: Vec<(usize, CudaFunc)>,
    pub kv_gather: CudaFunc,
    pub attention: Vec<(usize, CudaFunc)>,
    pub decode: Vec<(usize, CudaFunc)>,
    pub decode2: Vec<(usize, CudaFunc)>,
}

/// Every kvc kernel, looked up once.
pub struct Kernels {
    pub rmsnorm: CudaFunc,
    pub add_rmsnorm: CudaFunc,
    /// The MoE block's weighted sum, the residual add and the next RMSNorm
    /// in one launch.
    pub moe_sum_add_rmsnorm: CudaFunc,
    pub bf16_cache: CacheKernels,
    pub fp8_cache: CacheKernels,
    pub silu_mul: CudaFunc,
    pub silu_mul_scalar: CudaFunc,
    /// `silu_mul` quantized for the FP8 GEMMs in the same pass.
    pub silu_mul_quant: CudaFunc,
    pub gather_rows: CudaFunc,
    /// cuDNN's FP8 prefill attention: Q into e4m3, O's scale from V's
    /// amax, its O rows out of e4m3.
    pub bf16_to_e4m3: CudaFunc,
    pub e4m3_amax: CudaFunc,
    pub fp8_o_scale: CudaFunc,
    pub e4m3_rows_to_bf16: CudaFunc,
    /// An FP8-cache `qk_norm_rope_store_vec` that writes Q in e4m3 (a step
    /// whose attention is all cuDNN's FP8 route), by head dim.
    pub qk_norm_rope_store_e4m3q: Vec<(usize, CudaFunc)>,
    /// A device-computed float spread over an array (`fill_from`).
    pub fill_from: CudaFunc,
    pub attn_combine: CudaFunc,
    pub moe_topk: CudaFunc,
    pub moe_align: CudaFunc,
    pub moe_route: CudaFunc,
    /// The router's logits and the routing in one launch (a few tokens),
    /// and the count of its blocks done (one u32, 0 between launches).
    pub moe_router_route: CudaFunc,
    pub route_counter: Tensor,
    pub moe_gemm_small: CudaFunc,
    /// gemv.cu: products of a few rows (gemv.rs).
    pub small_m_gemm: CudaFunc,
    /// Its block-FP8 form (e4m3 weights with their block scales).
    pub small_m_gemm_fp8: CudaFunc,
    /// Its launch grid: blocks resident on the whole device at once.
    pub small_m_blocks: u32,
    /// gemv.cu's one-row kernels (a one-token decode), by chunks a lane
    /// ([`gemv::ONE_ROW_CHUNKS`]): bf16 weights, then block-FP8.
    pub one_row_gemm: [CudaFunc; 3],
    pub one_row_gemm_fp8: [CudaFunc; 3],
    /// The same over an MoE gate|up weight with SiLU * up in the
    /// epilogue: bf16 weights, then block-FP8.
    pub one_row_swiglu: [CudaFunc; 3],
    pub one_row_swiglu_fp8: [CudaFunc; 3],
    pub moe_gemm_tc: CudaFunc,
    pub moe_sum: CudaFunc,
    pub moe_sum_scalar: CudaFunc,
}

impl Kernels {
    pub fn load(dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        let get = |name: &str, module: &str, ptx: &str| -> Result<CudaFunc> {
            let f = dev.get_or_load_custom_func(name, module, ptx)?;
            Ok(CudaFunc { func: (*f).clone(), stream: stream.clone() })
        };
        let l = |name: &str| get(name, "kvc_layers", PTX_LAYERS);
        let a = |name: &str| get(name, "kvc_attention", PTX_ATTENTION);
        let m = |name: &str| get(name, "kvc_moe", PTX_MOE);
        // An attention kernel of one head dim, allowed `smem` bytes of
        // dynamic shared memory.
        let a_smem = |name: String, hd: usize, smem: usize| -> Result<(usize, CudaFunc)> {
            let f = a(&name)?;
            f.func.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
            Ok((hd, f))
        };
        // `suffix`: "" for a bf16 cache, "_fp8" for an e4m3 one.
        let cache_kernels = |suffix: &str| -> Result<CacheKernels> {
            let fp8 = !suffix.is_empty();
            let (mut attention, mut decode, mut decode2) = (Vec::new(), Vec::new(), Vec::new());
            for hd in [16usize, 32, 64, 128, 256] {
                attention.push(a_smem(format!("paged_attention{suffix}_hd{hd}"), hd, attention::smem_bytes(hd))?);
                decode.push(a_smem(format!("paged_decode{suffix}_hd{hd}"), hd, attention::decode_smem_bytes(hd))?);
                // One CTA of up to 210 KB per SM: ask for the largest shared
                // memory carveout (a hint; L1 barely serves this kernel).
                let f = a_smem(format!("paged_decode2{suffix}_hd{hd}"), hd, attention::decode2_smem_bytes(hd, fp8))?;
                f.1.func.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100).w()?;
                decode2.push(f);
            }
            Ok(CacheKernels {
                qk_norm_rope_store: l(&format!("qk_norm_rope_store{suffix}"))?,
                qk_norm_rope_store_vec: [2usize, 4, 8]
                    .iter()
                    .map(|&v| Ok((32 * v, l(&format!("qk_norm_rope_store{suffix}_v{v}"))?)))
                    .collect::<Result<_>>()?,
                kv_gather: l(&format!("kv_gather{suffix}"))?,
                attention,
                decode,
                decode2,
            })
        };
        let small_m_gemm = get("small_m_gemm", "kvc_gemv", PTX_GEMV)?;
        let small_m_gemm_fp8 = get("small_m_gemm_fp8", "kvc_gemv", PTX_GEMV)?;
        let sms = stream.context().attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).w()? as u32;
        let per_sm = small_m_gemm.func.occupancy_max_active_blocks_per_multiprocessor(gemv::BLOCK, 0, None).w()?;
        let small_m_blocks = sms * per_sm.max(1);
        let one_row = |name: &str| -> Result<[CudaFunc; 3]> {
            let [a, b, c] = gemv::ONE_ROW_CHUNKS.map(|kc| get(&format!("{name}_kc{kc}"), "kvc_gemv", PTX_GEMV));
            Ok([a?, b?, c?])
        };
        Ok(Self {
            rmsnorm: l("rmsnorm")?,
            add_rmsnorm: l("add_rmsnorm")?,
            moe_sum_add_rmsnorm: l("moe_sum_add_rmsnorm")?,
            bf16_cache: cache_kernels("")?,
            fp8_cache: cache_kernels("_fp8")?,
            silu_mul: l("silu_mul")?,
            silu_mul_scalar: l("silu_mul_scalar")?,
            silu_mul_quant: l("silu_mul_quant")?,
            gather_rows: l("gather_rows")?,
            bf16_to_e4m3: l("bf16_to_e4m3")?,
            e4m3_amax: l("e4m3_amax")?,
            fp8_o_scale: l("fp8_o_scale")?,
            e4m3_rows_to_bf16: l("e4m3_rows_to_bf16")?,
            qk_norm_rope_store_e4m3q: [2usize, 4, 8]
                .iter()
                .map(|&v| Ok((32 * v, l(&format!("qk_norm_rope_store_fp8_e4m3q_v{v}"))?)))
                .collect::<Result<_>>()?,
            fill_from: l("fill_from")?,
            attn_combine: a("attn_combine")?,
            moe_topk: m("moe_topk")?,
            moe_align: m("moe_align")?,
            moe_route: m("moe_route")?,
            moe_router_route: m("moe_router_route")?,
            route_counter: Tensor::zeros(1, DType::U32, &Device::Cuda(dev.clone()))?,
            moe_gemm_small: m("moe_gemm_small")?,
            small_m_gemm,
            small_m_gemm_fp8,
            small_m_blocks,
            one_row_gemm: one_row("one_row_gemm")?,
            one_row_gemm_fp8: one_row("one_row_gemm_fp8")?,
            one_row_swiglu: one_row("one_row_swiglu")?,
            one_row_swiglu_fp8: one_row("one_row_swiglu_fp8")?,
            moe_gemm_tc: m("moe_gemm_tc")?,
            moe_sum: m("moe_sum")?,
            moe_sum_scalar: m("moe_sum_scalar")?,
        })
    }
}

impl Kernels {
    /// The pool kernels for layers of `format`.
    pub fn cache(&self, format: CacheFormat) -> &CacheKernels {
        match format {
            CacheFormat::Bf16 => &self.bf16_cache,
            CacheFormat::Fp8 { .. } => &self.fp8_cache,
        }
    }
}

pub(crate) fn cuda_dev(device: &Device) -> Result<&CudaDevice> {
    device.as_cuda_device()
}

/// Device address of a contiguous CUDA tensor's first element.
pub fn ptr(t: &Tensor) -> Result<u64> {
    let (st, layout) = t.storage_and_layout();
    if !layout.is_contiguous() {
        bail!("kvc kernel input must be contiguous, got {:?}", layout);
    }
    let Storage::Cuda(cs) = &*st else { bail!("kvc kernel input must be on a CUDA device") };
    let stream = candle_core::backend::BackendStorage::device(cs).cuda_stream();
    fn base<T>(s: &CudaSlice<T>, stream: &std::sync::Arc<candle_core::cuda::cudarc::driver::CudaStream>) -> u64 {
        let (p, _sync) = s.device_ptr(stream);
        p
    }
    let p = match t.dtype() {
        // e4m3 bytes (fp8_linear.rs), named through the storage's enum.
        DType::F8E4M3 => match &cs.slice {
            candle_core::cuda::CudaStorageSlice::F8E4M3(s) => base(s, &stream),
            _ => bail!("an F8E4M3 tensor without e4m3 storage"),
        },
        DType::U8 => base(cs.as_cuda_slice::<u8>()?, &stream),
        DType::BF16 => base(cs.as_cuda_slice::<bf16>()?, &stream),
        DType::F32 => base(cs.as_cuda_slice::<f32>()?, &stream),
        DType::U32 => base(cs.as_cuda_slice::<u32>()?, &stream),
        DType::I64 => base(cs.as_cuda_slice::<i64>()?, &stream),
        other => bail!("kvc kernels take bf16/f32/u32/u8/e4m3 tensors, got {other:?}"),
    };
    Ok(p + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}

/// An uninitialised tensor (every kernel that fills one writes all of it).
pub fn empty(dev: &CudaDevice, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
    let shape = shape.into();
    let n = shape.elem_count().max(1);
    // SAFETY: the callers' kernels write every element before it is read.
    let storage = unsafe {
        match dtype {
            DType::BF16 => CudaStorage::wrap_cuda_slice(dev.alloc::<bf16>(n)?, dev.clone()),
            DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc::<f32>(n)?, dev.clone()),
            DType::U32 => CudaStorage::wrap_cuda_slice(dev.alloc::<u32>(n)?, dev.clone()),
            DType::U8 => CudaStorage::wrap_cuda_slice(dev.alloc::<u8>(n)?, dev.clone()),
            other => bail!("empty: unsupported dtype {other:?}"),
        }
    };
    Ok(Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false))
}

/// A zeroed 1-D tensor in memory from `cuMemAlloc`, not from the
/// stream-ordered pool: CUDA IPC (`cudaIpcGetMemHandle`, which Mooncake's
/// intra-node NVLink transport uses to let a peer process write into it)
/// refuses pool memory. Meant for the KV pool, which lives as long as the
/// process: the allocation is never freed.
pub fn zeros_shareable(device: &Device, n: usize, dtype: DType) -> Result<Tensor> {
    let dev = cuda_dev(device)?;
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().w()?;
    let bytes = n.max(1) * dtype.size_in_bytes();
    // SAFETY: a fresh allocation of `bytes`, zeroed before it is wrapped.
    let storage = unsafe {
        use candle_core::cuda::cudarc::driver::result;
        let p = result::malloc_sync(bytes).w()?;
        result::memset_d8_sync(p, 0, bytes).w()?;
        match dtype {
            DType::BF16 => CudaStorage::wrap_cuda_slice(stream.upgrade_device_ptr::<bf16>(p, n.max(1)), dev.clone()),
            DType::F32 => CudaStorage::wrap_cuda_slice(stream.upgrade_device_ptr::<f32>(p, n.max(1)), dev.clone()),
            DType::F16 => CudaStorage::wrap_cuda_slice(stream.upgrade_device_ptr::<half::f16>(p, n.max(1)), dev.clone()),
            DType::F8E4M3 => CudaStorage::wrap_cuda_slice(stream.upgrade_device_ptr::<float8::F8E4M3>(p, n.max(1)), dev.clone()),
            other => bail!("zeros_shareable: unsupported dtype {other:?}"),
        }
    };
    let t = Tensor::from_storage(Storage::Cuda(storage), n, BackpropOp::none(), false);
    // Never freed: dropping the slice would free it as pool memory.
    std::mem::forget(t.clone());
    Ok(t)
}

pub(crate) fn upload_u32(v: Vec<u32>, device: &Device) -> Result<Tensor> {
    let n = v.len();
    let v = if v.is_empty() { vec![0] } else { v };
    let t = Tensor::from_vec(v, n.max(1), device)?;
    Ok(t)
}

/// Overwrites the first `src.len()` values of the u32 tensor `dst` (from
/// [`upload_u32`]) with `src`, in stream order: the inputs of a CUDA
/// graph's next replay.
pub(crate) fn overwrite_u32(dst: &Tensor, src: &[u32]) -> Result<()> {
    if dst.dtype() != DType::U32 || dst.elem_count() < src.len() {
        bail!("overwrite_u32: {} values into {:?} {:?}", src.len(), dst.shape(), dst.dtype());
    }
    if src.is_empty() {
        return Ok(());
    }
    let stream = cuda_dev(dst.device())?.cuda_stream();
    stream.context().bind_to_thread().w()?;
    // SAFETY: `dst` holds at least `src.len()` u32s on this device; a copy
    // from pageable memory returns once the source has been read.
    unsafe { candle_core::cuda::cudarc::driver::result::memcpy_htod_async(ptr(dst)?, src, stream.cu_stream()) }.w()
}

/// `out[i] = x[idx[i] / row_div]` for the `r` rows of `idx` (u32): a row
/// gather that, unlike candle's `index_select`, copies nothing from the
/// host, so a CUDA graph can capture it. `x` is `[_, k]` of any dtype
/// whose rows are a whole number of 2-byte units (the kernel copies bf16
/// units: bf16 rows, e4m3 rows of even width, f32 rows); `out` has its
/// dtype.
pub(crate) fn gather_rows(k: &Kernels, x: &Tensor, idx: &Tensor, row_div: usize, r: usize) -> Result<Tensor> {
    let (_, kd) = x.dims2()?;
    let row_bytes = kd * x.dtype().size_in_bytes();
    if row_bytes % 2 != 0 {
        bail!("gather_rows: rows of {kd} {:?} are {row_bytes} bytes, not whole 2-byte units", x.dtype());
    }
    let x = x.contiguous()?;
    let out = empty(cuda_dev(x.device())?, (r, kd), x.dtype())?;
    let cfg = LaunchConfig { grid_dim: (r as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    launch!(k.gather_rows, cfg, ptr(&x)?, ptr(idx)?, row_div as i32, ptr(&out)?, r as i32, (row_bytes / 2) as i32)?;
    Ok(out)
}

pub(crate) fn grid1(n: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(block).clamp(1, 65535 * 16), 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Start-up for a CUDA device: keep freed memory in the stream-ordered
/// pool instead of returning it to the driver at every synchronisation
/// (GPU.md: 2x on large copies).
pub fn prepare_device(device: &Device) -> Result<()> {
    let dev = cuda_dev(device)?;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    unsafe {
        let mut pool = std::mem::MaybeUninit::<sys::CUmemoryPool>::uninit();
        let r = sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), ctx.cu_device());
        if r != sys::CUresult::CUDA_SUCCESS {
            bail!("cuDeviceGetDefaultMemPool: {r:?}");
        }
        let mut threshold: u64 = u64::MAX;
        let r = sys::cuMemPoolSetAttribute(
            pool.assume_init(),
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut std::ffi::c_void,
        );
        if r != sys::CUresult::CUDA_SUCCESS {
            bail!("cuMemPoolSetAttribute: {r:?}");
        }
    }
    Ok(())
}

/// (free, total) bytes of device memory.
pub fn memory_info(device: &Device) -> Result<(usize, usize)> {
    let dev = cuda_dev(device)?;
    dev.cuda_stream().context().mem_get_info().w()
}

/// Starts (`on`) or stops the profiler's collection on `device`'s context
/// (`cuProfilerStart`/`Stop`): `ncu --profile-from-start off` then
/// profiles only the kernels launched in between (kvc-bench's
/// `KVC_BENCH_PROFILE`).
pub fn profiler(device: &Device, on: bool) -> Result<()> {
    let dev = cuda_dev(device)?;
    dev.cuda_stream().context().bind_to_thread().w()?;
    // SAFETY: plain driver calls on the bound context.
    let r = unsafe {
        if on {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        bail!("cuProfiler{}: {r:?}", if on { "Start" } else { "Stop" });
    }
    Ok(())
}
