//! A block-FP8 checkpoint's projections kept in FP8 on the GPU (issue 35):
//! e4m3 bytes `[.., N, K]` with the checkpoint's f32 `weight_scale_inv`
//! `[.., ceil(N / 128), K / 128]` as they are stored, run by CUTLASS's sm90
//! block-scaled FP8 GEMMs (cutlass-sys's fp8.rs): before each projection
//! its bf16 input is quantized per token and 128-wide group
//! (`quant_rows`), then the dense GEMM (attention and dense MLP
//! projections) or the grouped one (MoE experts, moe.rs) writes bf16.
//! Every call only queues kernels and stream-ordered allocations, so the
//! decode steps' CUDA graphs hold them as they hold the bf16 GEMMs.
//!
//! Whether models keep FP8 weights is the engine's kernel plan
//! ([`set_fp8_weights`]; `KVC_FP8_GEMM`); unset, they do where the FP8
//! GEMMs run. [`ProjectionLoader`] loads each projection in FP8 or bf16
//! and says once which FP8 weights it had to dequantize, and why.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use candle_core::{bail, CudaDevice, DType, Result, Tensor};
use candle_nn::{Init, VarBuilder};
use cutlass_sys::fp8;

use super::cudnn_fp8::E4m3Output;
use super::gemv::{fits_fp8, small_m_linear_fp8};
use super::layers::{silu_mul, Form};
use super::moe_gemm::{cutlass_tiling, moe_gemm, MoeGemm};
use super::{cuda_dev, empty, gather_rows, grid1, launch, ptr, Kernels};
use crate::fp8::{BlockFp8, GEMM_BLOCK};

/// Rows up to which an FP8 projection runs on the few-row kernel
/// (gemv.cu's `small_m_gemm_fp8`) instead of quantizing its input for
/// CUTLASS's 128-row tiles: decode steps of a few sequences.
pub const FEW_ROWS: usize = 4;

/// Rows up to which a dense FP8 projection runs on CUTLASS's swapped
/// 64-row tiling ([`fp8::DenseTiling::Swap64`]: 64 weight rows a tile,
/// twice the CTAs of the 128-row one) unless the kernel plan says
/// otherwise (`KVC_FP8_DENSE_SWAP_ROWS`). On one H100 (2026-12-08,
/// docs/benchmarks.md) the swap took 67-87 % of the 128-row tiles' time
/// for qkv and o_proj at 1-64 rows, a graphed 64 x 2K step 1.2-1.4 % less
/// and an 8 x 2K one 2-3 %; at 128 rows (two token tiles) qkv was slower
/// on it.
pub const SWAP64_ROWS: usize = 64;

/// The kernel plan's bound for the swapped tiling; `usize::MAX`: not set.
static SWAP_ROWS: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets the most rows a dense FP8 projection takes on the swapped 64-row
/// tiling (0: never; None: [`SWAP64_ROWS`]).
pub fn set_fp8_dense_swap_rows(rows: Option<usize>) {
    SWAP_ROWS.store(rows.unwrap_or(usize::MAX), Ordering::Relaxed);
}

fn swap_rows() -> usize {
    match SWAP_ROWS.load(Ordering::Relaxed) {
        usize::MAX => SWAP64_ROWS,
        n => n,
    }
}

/// 0: not chosen (FP8 where the GEMMs run); 1: FP8; 2: dequantize.
static CHOICE: AtomicU8 = AtomicU8::new(0);

/// Whether CUTLASS's FP8 GEMMs run on this device (Err: why not).
pub fn fp8_gemm_runs() -> std::result::Result<(), String> {
    fp8::check().map_err(|e| e.to_string())
}

/// Whether GPU models built from now on keep block-FP8 weights in FP8
/// (`false`: dequantized at load). The engine's kernel plan sets it;
/// tests and benchmarks load both ways.
pub fn set_fp8_weights(on: bool) {
    CHOICE.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// The current choice: the one set, else FP8 where the GEMMs run.
pub fn fp8_weights() -> bool {
    match CHOICE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => fp8_gemm_runs().is_ok(),
    }
}

fn err(e: fp8::Error) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// candle's stream, bound to this thread, as the FP8 shim takes it.
fn stream(dev: &CudaDevice) -> Result<*mut c_void> {
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    Ok(stream.cu_stream() as *mut c_void)
}

/// `words` u32 of device scratch (at least 64: the shim wants a real address).
fn workspace(dev: &CudaDevice, bytes: usize) -> Result<(Tensor, u64)> {
    let words = bytes.div_ceil(4).max(64);
    Ok((empty(dev, words, DType::U32)?, (words * 4) as u64))
}

/// bf16 rows quantized per token and 128-wide group: e4m3 `[m, k]` (as
/// u8) and f32 scales `[m, k / 128]`.
struct QuantRows {
    q: Tensor,
    s: Tensor,
}

fn quant_rows(dev: &CudaDevice, x: &Tensor) -> Result<QuantRows> {
    let (m, k) = x.dims2()?;
    if x.dtype() != DType::BF16 {
        bail!("FP8 GEMM input must be bf16, got {:?}", x.dtype());
    }
    let x = x.contiguous()?;
    let q = empty(dev, (m, k), DType::U8)?;
    let s = empty(dev, (m, k.div_ceil(GEMM_BLOCK)), DType::F32)?;
    if m > 0 {
        // SAFETY: x, q, s are live device tensors of these shapes on this
        // device; the stream orders their frees after the kernel.
        unsafe { fp8::quant_rows(ptr(&x)?, ptr(&q)?, ptr(&s)?, m, k, stream(dev)?) }.map_err(err)?;
    }
    Ok(QuantRows { q, s })
}

/// `x: [m, k]` bf16 quantized per token and 128-wide group, as the FP8
/// GEMMs take it: (e4m3 `[m, k]` as u8, f32 scales `[m, ceil(k / 128)]`).
pub fn quantize_rows(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let QuantRows { q, s } = quant_rows(cuda_dev(x.device())?, x)?;
    Ok((q, s))
}

/// SiLU(gate) * up of `gu: [r, 2i]` (gate columns first) quantized as
/// [`quantize_rows`] quantizes `silu_mul`'s bf16 result, in one kernel
/// where `i % 128 == 0` (else the two steps).
fn silu_mul_quant(k: &Kernels, gu: &Tensor) -> Result<QuantRows> {
    let (r, i2) = gu.dims2()?;
    let i = i2 / 2;
    // One thread per 8 outputs with no grid stride: grid1's block cap bounds it.
    if i % GEMM_BLOCK != 0 || i2 % 2 != 0 || r * i / 8 > MAX_GRID_BLOCKS * 256 {
        return quant_rows(cuda_dev(gu.device())?, &silu_mul(k, gu, Form::Auto)?);
    }
    let dev = cuda_dev(gu.device())?;
    let gu = gu.contiguous()?;
    let q = empty(dev, (r, i), DType::U8)?;
    let s = empty(dev, (r, i / GEMM_BLOCK), DType::F32)?;
    if r > 0 {
        let (ri, ii) = (r as i32, i as i32);
        launch!(k.silu_mul_quant, grid1(r * i / 8, 256), ptr(&gu)?, ptr(&q)?, ptr(&s)?, ri, ii)?;
    }
    Ok(QuantRows { q, s })
}

/// The most blocks [`grid1`] launches.
const MAX_GRID_BLOCKS: usize = 65535 * 16;

/// [`silu_mul_quant`]'s e4m3 rows and scales (for the GPU tests).
pub fn silu_mul_quantized(k: &Kernels, gu: &Tensor) -> Result<(Tensor, Tensor)> {
    let QuantRows { q, s } = silu_mul_quant(k, gu)?;
    Ok((q, s))
}

impl QuantRows {
    /// Rows `idx[i] / row_div` of these, for the `r` entries of `idx` (the
    /// MoE's gather into expert order, on e4m3 rows and their scales: half
    /// of the bf16 rows' bytes).
    fn gather(&self, k: &Kernels, idx: &Tensor, row_div: usize, r: usize) -> Result<QuantRows> {
        Ok(QuantRows { q: gather_rows(k, &self.q, idx, row_div, r)?, s: gather_rows(k, &self.s, idx, row_div, r)? })
    }
}

/// `w: [.., N, K]` on the GPU quantized into 128x128 blocks as block-FP8
/// checkpoints are made ([`BlockFp8::quantize`]'s GPU half): the e4m3
/// weight and its f32 scales `[.., ceil(N / 128), ceil(K / 128)]`.
pub fn quantize_blocks(w: &Tensor) -> Result<(Tensor, Tensor)> {
    let dev = cuda_dev(w.device())?;
    let dims = w.dims().to_vec();
    if dims.len() < 2 {
        bail!("block-FP8 quantization of a {}-D tensor: it takes [.., N, K]", dims.len());
    }
    let (n, k) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let experts = dims[..dims.len() - 2].iter().product::<usize>();
    let mut sdims = dims[..dims.len() - 2].to_vec();
    sdims.extend([n.div_ceil(GEMM_BLOCK), k.div_ceil(GEMM_BLOCK)]);
    let w = w.to_dtype(DType::BF16)?.contiguous()?;
    let q = Tensor::zeros(dims.as_slice(), DType::F8E4M3, w.device())?;
    let s = empty(dev, sdims.as_slice(), DType::F32)?;
    if experts * n * k > 0 {
        // SAFETY: w, q, s are live device tensors of these shapes on this
        // device; the stream orders their frees after the kernel.
        unsafe { fp8::quant_blocks(ptr(&w)?, ptr(&q)?, ptr(&s)?, experts, n, k, stream(dev)?) }.map_err(err)?;
    }
    Ok((q, s))
}

/// One FP8 projection, or a stack of them (experts): `q` e4m3 `[.., N, K]`,
/// `scale` f32 `[.., ceil(N / 128), K / 128]`; a single projection also
/// keeps `scale64`, its scales with every row repeated
/// (`[ceil(N / 64), K / 128]`), for the swapped 64-row tiling.
pub struct Fp8Weight {
    q: Tensor,
    scale: Tensor,
    scale64: Option<Tensor>,
}

impl Fp8Weight {
    /// The CUTLASS call's operands: quantized rows `a` against these
    /// weights into `d`, with scratch `ws` of `bytes`.
    fn operands(&self, a: &QuantRows, d: &Tensor, (ws, bytes): (&Tensor, u64), sw: &Tensor) -> Result<fp8::Operands> {
        Ok(fp8::Operands {
            a: ptr(&a.q)?,
            sa: ptr(&a.s)?,
            w: ptr(&self.q)?,
            sw: ptr(sw)?,
            d: ptr(d)?,
            workspace: ptr(ws)?,
            workspace_bytes: bytes,
        })
    }

    /// Checks the pair against the GEMMs' layout.
    pub fn new(q: Tensor, scale: Tensor) -> Result<Self> {
        let (qd, sd) = (q.dims().to_vec(), scale.dims().to_vec());
        if q.dtype() != DType::F8E4M3 || scale.dtype() != DType::F32 || qd.len() < 2 || qd.len() != sd.len() {
            bail!("FP8 weight: e4m3 [.., N, K] with f32 scales of the same rank, got {:?} {qd:?}, {:?} {sd:?}", q.dtype(), scale.dtype());
        }
        let (n, k) = (qd[qd.len() - 2], qd[qd.len() - 1]);
        let mut want = qd[..qd.len() - 2].to_vec();
        want.extend([n.div_ceil(GEMM_BLOCK), k.div_ceil(GEMM_BLOCK)]);
        if sd != want || n % 16 != 0 || k % GEMM_BLOCK != 0 {
            bail!("FP8 weight {qd:?} with scales {sd:?}: the GEMMs take N a multiple of 16, K of 128, scales {want:?}");
        }
        let scale64 = match sd[..] {
            [nb, kb] => {
                Some(scale.unsqueeze(1)?.broadcast_as((nb, 2, kb))?.reshape((2 * nb, kb))?.narrow(0, 0, n.div_ceil(64))?.contiguous()?)
            }
            _ => None,
        };
        Ok(Self { q: q.contiguous()?, scale: scale.contiguous()?, scale64 })
    }

    /// Row blocks fused into one weight (q|k|v, gate|up): every part but
    /// the last whole 128-row blocks, so the scale rows line up.
    pub fn cat(parts: Vec<Fp8Weight>) -> Result<Self> {
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part"));
        }
        let d = parts[0].q.rank() - 2;
        let q: Vec<&Tensor> = parts.iter().map(|p| &p.q).collect();
        let s: Vec<&Tensor> = parts.iter().map(|p| &p.scale).collect();
        Self::new(Tensor::cat(&q, d)?, Tensor::cat(&s, d)?)
    }

    /// Experts' weights stacked `[E, N, K]`.
    pub fn stack(experts: Vec<Fp8Weight>) -> Result<Self> {
        let q: Vec<&Tensor> = experts.iter().map(|p| &p.q).collect();
        let s: Vec<&Tensor> = experts.iter().map(|p| &p.scale).collect();
        Self::new(Tensor::stack(&q, 0)?, Tensor::stack(&s, 0)?)
    }

    /// (N, K).
    pub fn dims(&self) -> (usize, usize) {
        let d = self.q.dims();
        (d[d.len() - 2], d[d.len() - 1])
    }

    /// Bytes on the device: the e4m3 weight and its scales.
    pub fn bytes(&self) -> usize {
        self.q.elem_count() + 4 * (self.scale.elem_count() + self.scale64.as_ref().map_or(0, Tensor::elem_count))
    }

    /// The e4m3 weight and its block scales.
    pub(crate) fn parts(&self) -> (&Tensor, &Tensor) {
        (&self.q, &self.scale)
    }

    /// `x: [M, K]` bf16 -> `x W^T: [M, N]` bf16: up to [`FEW_ROWS`] rows on
    /// kvc's few-row kernel (the weights streamed once, x in bf16), more
    /// on CUTLASS's FP8 GEMM with the input quantized per token and
    /// 128-wide group first.
    pub fn linear(&self, kernels: &Kernels, x: &Tensor) -> Result<Tensor> {
        let dev = cuda_dev(x.device())?;
        let (m, k) = x.dims2()?;
        let (n, kw) = self.q.dims2()?;
        if k != kw {
            bail!("FP8 linear: input [{m}, {k}] against weight [{n}, {kw}]");
        }
        if (1..=FEW_ROWS).contains(&m) && fits_fp8(n, k) {
            return small_m_linear_fp8(kernels, x, &self.q, &self.scale);
        }
        if m == 0 {
            return empty(dev, (m, n), DType::BF16);
        }
        self.dense(&quant_rows(dev, x)?)
    }

    /// `x W^T` of rows already in e4m3 (`q`: u8 `[M, K]`) with their f32
    /// scales `[M, K / 128]` (one per token and 128-wide group) -> bf16
    /// `[M, N]`, on CUTLASS at any M (cuDNN's e4m3 attention output into
    /// o_proj).
    pub fn linear_e4m3(&self, q: &Tensor, s: &Tensor) -> Result<Tensor> {
        let ((m, k), (n, kw)) = (q.dims2()?, self.q.dims2()?);
        if k != kw || q.dtype() != DType::U8 || s.dtype() != DType::F32 || s.dims2()? != (m, k.div_ceil(GEMM_BLOCK)) {
            bail!("FP8 linear: e4m3 input {:?} {:?} with scales {:?} against weight [{n}, {kw}]", q.shape(), q.dtype(), s.shape());
        }
        if m == 0 {
            return empty(cuda_dev(q.device())?, (m, n), DType::BF16);
        }
        self.dense(&QuantRows { q: q.clone(), s: s.clone() })
    }

    /// CUTLASS's dense FP8 GEMM over quantized rows: up to the plan's
    /// swap bound on the swapped 64-row tiling, else on 128-row tiles.
    fn dense(&self, a: &QuantRows) -> Result<Tensor> {
        let dev = cuda_dev(a.q.device())?;
        let ((m, k), (n, _)) = (a.q.dims2()?, self.q.dims2()?);
        let (tiling, sw) = match &self.scale64 {
            Some(s64) if m <= swap_rows() => (fp8::DenseTiling::Swap64, s64),
            _ => (fp8::DenseTiling::Rows, &self.scale),
        };
        let d = empty(dev, (m, n), DType::BF16)?;
        let (ws, ws_bytes) = workspace(dev, fp8::dense_workspace_bytes(m, n, k, tiling).map_err(err)?)?;
        let int = |v: usize| i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("FP8 linear: {v} does not fit an i32")));
        let op = self.operands(a, &d, (&ws, ws_bytes), sw)?;
        let args = fp8::DenseArgs { m: int(m)?, n: int(n)?, k: int(k)?, variant: tiling as i32, op };
        // SAFETY: every address is a live contiguous tensor of the sizes in
        // `args` on this device; the stream orders their frees after the GEMM.
        unsafe { fp8::dense_run(&args, stream(dev)?) }.map_err(err)?;
        Ok(d)
    }

    /// For every expert e of this `[E, N, K]` stack: `out[r] = a[r] W[e]^T`
    /// over its rows `offsets[e]..offsets[e + 1]` (offsets on the device),
    /// `a: [rows, K]` bf16 quantized here, `out: [rows, N]` bf16.
    pub fn grouped(&self, offsets: &Tensor, a: &Tensor, out: &Tensor) -> Result<()> {
        if a.dim(0)? == 0 {
            return Ok(());
        }
        self.grouped_quantized(offsets, &quant_rows(cuda_dev(a.device())?, a)?, out)
    }

    /// [`Self::grouped`] over the rows `idx[r] / row_div` of `x: [T, K]`
    /// bf16 (the MoE's gather of each pair's token into expert order, one
    /// row per entry of `idx` and of `out`): `x` is quantized once per
    /// token, before the gather, and the gather moves e4m3 rows and their
    /// scales.
    pub fn grouped_gathered(&self, k: &Kernels, offsets: &Tensor, x: &Tensor, idx: &Tensor, row_div: usize, out: &Tensor) -> Result<()> {
        let rows = out.dim(0)?;
        if rows == 0 {
            return Ok(());
        }
        let aq = quant_rows(cuda_dev(x.device())?, x)?.gather(k, idx, row_div, rows)?;
        self.grouped_quantized(offsets, &aq, out)
    }

    /// [`Self::grouped`] over SiLU(gate) * up of `gu: [rows, 2K]` (the MoE's
    /// down projection), quantized in the same pass as the SiLU.
    pub fn grouped_silu(&self, k: &Kernels, offsets: &Tensor, gu: &Tensor, out: &Tensor) -> Result<()> {
        if gu.dim(0)? == 0 {
            return Ok(());
        }
        self.grouped_quantized(offsets, &silu_mul_quant(k, gu)?, out)
    }

    fn grouped_quantized(&self, offsets: &Tensor, aq: &QuantRows, out: &Tensor) -> Result<()> {
        let dev = cuda_dev(out.device())?;
        let (e, n, k) = self.q.dims3()?;
        let (rows, ka) = aq.q.dims2()?;
        if ka != k || out.dims2()? != (rows, n) {
            bail!("FP8 grouped GEMM: input [{rows}, {ka}], output {:?} against experts [{e}, {n}, {k}]", out.shape());
        }
        if rows == 0 {
            return Ok(());
        }
        // The bf16 experts' rule and override (moe_gemm.rs): the weights on
        // the tile's M where each expert has only a few rows (decode, mixed
        // steps), the rows on M for prefill.
        let variant = match moe_gemm()? {
            MoeGemm::Cutlass(Some(t)) => t,
            _ => cutlass_tiling(rows, e),
        };
        let (ws, ws_bytes) = workspace(dev, fp8::grouped_workspace_bytes(e, variant).map_err(err)?)?;
        let groups = cutlass_sys::Groups::new(ptr(offsets)?, (e, n, k), variant).map_err(err)?;
        let args = fp8::GroupedArgs { groups, op: self.operands(aq, out, (&ws, ws_bytes), &self.scale)? };
        // SAFETY: as in `linear`; `offsets` holds E + 1 row offsets into `a` and `out`.
        unsafe { fp8::grouped_run(&args, stream(dev)?) }.map_err(err)
    }
}

/// A projection's weight on the GPU: bf16 `[N, K]` (cuBLAS) or FP8.
pub enum GpuLinear {
    Bf16(Tensor),
    Fp8(Fp8Weight),
}

impl GpuLinear {
    /// `x: [M, K]` bf16 -> `x W^T: [M, N]` bf16.
    pub fn forward(&self, kernels: &Kernels, x: &Tensor) -> Result<Tensor> {
        match self {
            GpuLinear::Bf16(w) => x.matmul(&w.t()?),
            GpuLinear::Fp8(w) => w.linear(kernels, x),
        }
    }

    /// [`Self::forward`] of cuDNN's e4m3 attention output: straight into
    /// an FP8 weight's GEMM (O's scale as every group's), else widened to
    /// bf16 first (bf16 weights, or few rows for the few-row kernel).
    pub fn forward_e4m3(&self, kernels: &Kernels, a: &E4m3Output) -> Result<Tensor> {
        match self {
            GpuLinear::Fp8(w) if a.o.dim(0)? > FEW_ROWS => w.linear_e4m3(&a.o, &a.group_scales(kernels, GEMM_BLOCK)?),
            _ => self.forward(kernels, &a.to_bf16(kernels)?),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            GpuLinear::Bf16(w) => w.elem_count() * w.dtype().size_in_bytes(),
            GpuLinear::Fp8(w) => w.bytes(),
        }
    }

    pub fn is_fp8(&self) -> bool {
        matches!(self, GpuLinear::Fp8(_))
    }
}

/// The device bytes of a GPU model's weights (`Qwen3Model::gpu_weight_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WeightBytes {
    /// The decoder layers' projections and experts (what a block-FP8
    /// checkpoint quantizes), scales included.
    pub projections: usize,
    /// How many of those weights (a fused q|k|v or gate|up counts once, an
    /// expert stack once) are held in FP8, and how many in bf16.
    pub fp8_weights: usize,
    pub bf16_weights: usize,
    /// Everything: projections, norms, routers, embeddings, LM head.
    pub total: usize,
}

/// The experts of one MoE layer: bf16 or FP8 stacks.
pub(crate) enum ExpertWeights {
    /// `gate_up [E, 2I, H]`, `down [E, H, I]`.
    Bf16(Tensor, Tensor),
    Fp8(Fp8Weight, Fp8Weight),
}

/// Loads a GPU model's projections: in FP8 where the checkpoint stores
/// them so (a `weight_scale_inv` beside the weight), the model keeps FP8
/// weights ([`fp8_weights`]) and the GEMMs take the shape
/// ([`BlockFp8::gemm_fit`]); else in bf16, dequantized at load where they
/// are stored in FP8, noting why ([`Self::finish`] logs it once).
pub(crate) struct ProjectionLoader {
    /// The checkpoint's block-FP8 config when its weights stay FP8.
    fp8: Option<BlockFp8>,
    /// FP8 weights dequantized for their shape: (which, why).
    dequantized: Vec<(String, String)>,
    kept: usize,
}

fn stored_fp8(vb: &VarBuilder, name: &str) -> bool {
    vb.contains_tensor(&BlockFp8::scale_name(name))
}

impl ProjectionLoader {
    pub fn new(fp8: Option<BlockFp8>) -> Self {
        Self { fp8: fp8.filter(|_| fp8_weights()), dequantized: Vec::new(), kept: 0 }
    }

    /// Whether the weights named by `parts` (module, tensor name, rows) of
    /// `k` columns load in FP8; a note when they are FP8 in the checkpoint
    /// but the GEMMs cannot take them.
    fn keeps_fp8(&mut self, what: &str, parts: &[(&VarBuilder, &str, usize)], k: usize) -> bool {
        let Some(fp8) = self.fp8 else { return false };
        let stored = parts.iter().filter(|(vb, name, _)| stored_fp8(vb, name)).count();
        if stored == 0 {
            return false;
        }
        let why = if stored < parts.len() {
            Err("some fused parts are stored in bf16".to_string())
        } else {
            fp8.gemm_fit(&parts.iter().map(|p| p.2).collect::<Vec<_>>(), k)
        };
        match why {
            Ok(()) => {
                self.kept += 1;
                true
            }
            Err(why) => {
                self.dequantized.push((what.to_string(), why));
                false
            }
        }
    }

    fn fp8_part(vb: &VarBuilder, name: &str, lead: &[usize], rows: usize, k: usize) -> Result<Fp8Weight> {
        let mut qs = lead.to_vec();
        qs.extend([rows, k]);
        let mut ss = lead.to_vec();
        ss.extend([rows.div_ceil(GEMM_BLOCK), k.div_ceil(GEMM_BLOCK)]);
        let q = vb.get_with_hints_dtype(qs, name, Init::Const(0.), DType::F8E4M3)?;
        let s = vb.get_with_hints_dtype(ss, &BlockFp8::scale_name(name), Init::Const(0.), DType::F32)?;
        Fp8Weight::new(q, s)
    }

    /// One projection of `k` columns, fused from `parts` (module, rows),
    /// each module's tensor `weight`.
    pub fn linear(&mut self, what: &str, parts: &[(VarBuilder, usize)], k: usize) -> Result<GpuLinear> {
        let named: Vec<(&VarBuilder, &str, usize)> = parts.iter().map(|(vb, rows)| (vb, "weight", *rows)).collect();
        if self.keeps_fp8(what, &named, k) {
            let w = parts.iter().map(|(vb, rows)| Self::fp8_part(vb, "weight", &[], *rows, k)).collect::<Result<Vec<_>>>()?;
            return Ok(GpuLinear::Fp8(Fp8Weight::cat(w)?));
        }
        let w = parts.iter().map(|(vb, rows)| vb.get((*rows, k), "weight")).collect::<Result<Vec<_>>>()?;
        Ok(GpuLinear::Bf16(if w.len() == 1 { w[0].clone() } else { Tensor::cat(&w, 0)? }))
    }

    /// A MoE layer's `e` experts of width `i` over hidden `h` from `ev`
    /// (`...mlp.experts`): fused (`gate_up_proj [E, 2I, H]`, `down_proj
    /// [E, H, I]`) or one module per expert.
    pub fn experts(&mut self, what: &str, ev: &VarBuilder, e: usize, i: usize, h: usize) -> Result<ExpertWeights> {
        if ev.contains_tensor("gate_up_proj") {
            let gu = self.keeps_fp8(&format!("{what}.gate_up_proj"), &[(ev, "gate_up_proj", 2 * i)], h);
            let dn = self.keeps_fp8(&format!("{what}.down_proj"), &[(ev, "down_proj", h)], i);
            if self.both(what, gu, dn) {
                let gu = Self::fp8_part(ev, "gate_up_proj", &[e], 2 * i, h)?;
                let dn = Self::fp8_part(ev, "down_proj", &[e], h, i)?;
                return Ok(ExpertWeights::Fp8(gu, dn));
            }
            return Ok(ExpertWeights::Bf16(ev.get((e, 2 * i, h), "gate_up_proj")?, ev.get((e, h, i), "down_proj")?));
        }
        // One decision for the layer's stacks, judged on expert 0 (a
        // checkpoint quantizes all its experts alike).
        let x0 = ev.pp("0");
        let (g0, u0, d0) = (x0.pp("gate_proj"), x0.pp("up_proj"), x0.pp("down_proj"));
        let gu_fp8 = self.keeps_fp8(&format!("{what}.gate_up"), &[(&g0, "weight", i), (&u0, "weight", i)], h);
        let dn_fp8 = self.keeps_fp8(&format!("{what}.down_proj"), &[(&d0, "weight", h)], i);
        if self.both(what, gu_fp8, dn_fp8) {
            let (mut gu, mut dn) = (Vec::with_capacity(e), Vec::with_capacity(e));
            for j in 0..e {
                let x = ev.pp(j.to_string());
                let parts =
                    vec![Self::fp8_part(&x.pp("gate_proj"), "weight", &[], i, h)?, Self::fp8_part(&x.pp("up_proj"), "weight", &[], i, h)?];
                gu.push(Fp8Weight::cat(parts)?);
                dn.push(Self::fp8_part(&x.pp("down_proj"), "weight", &[], h, i)?);
            }
            return Ok(ExpertWeights::Fp8(Fp8Weight::stack(gu)?, Fp8Weight::stack(dn)?));
        }
        let (mut gu, mut dn) = (Vec::with_capacity(e), Vec::with_capacity(e));
        for j in 0..e {
            let x = ev.pp(j.to_string());
            gu.push(Tensor::cat(&[x.pp("gate_proj").get((i, h), "weight")?, x.pp("up_proj").get((i, h), "weight")?], 0)?);
            dn.push(x.pp("down_proj").get((h, i), "weight")?);
        }
        Ok(ExpertWeights::Bf16(Tensor::stack(&gu, 0)?, Tensor::stack(&dn, 0)?))
    }

    /// Whether a layer's two expert projections both stay FP8: the grouped
    /// block runs them alike, so where only one could, it is dequantized
    /// too (and noted).
    fn both(&mut self, what: &str, gate_up: bool, down: bool) -> bool {
        if gate_up != down {
            self.kept -= 1;
            self.dequantized.push((what.to_string(), "its other expert projection cannot run in FP8".into()));
        }
        gate_up && down
    }

    /// Logs what was loaded how: one line for the FP8 weights kept, one
    /// (a warning) naming those dequantized for their shape and why.
    pub fn finish(self) {
        let Some(fp8) = self.fp8 else { return };
        tracing::info!(block = ?fp8.block, fp8_weights = self.kept, dequantized = self.dequantized.len(), "block-FP8 weights kept in FP8 on the GPU (FP8 GEMMs)");
        if !self.dequantized.is_empty() {
            let list: Vec<String> = self.dequantized.iter().take(8).map(|(w, why)| format!("{w} ({why})")).collect();
            let more = self.dequantized.len().saturating_sub(8);
            tracing::warn!(
                count = self.dequantized.len(),
                "FP8 weights dequantized at load, their shape not one the FP8 GEMMs take: {}{}",
                list.join(", "),
                if more > 0 { format!(", ... ({more} more)") } else { String::new() }
            );
        }
    }
}
