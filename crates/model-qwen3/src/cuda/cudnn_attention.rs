//! Prefill-shaped attention through cuDNN's fused SDPA (its Hopper
//! kernels run at FlashAttention-3 speed; kvc's wmma kernel at about a
//! tenth of it). A step's prefill chunks (more query rows than a decode
//! work item holds) form one varlen cuDNN call: Q and O are ragged over
//! the batch's token rows in place, K and V are either gathered from the
//! paged pool into contiguous buffers ("cudnn", the default) or read in
//! place through page tables ("cudnn-paged"), and the mask is causal with
//! bottom-right alignment so a chunk attends to its whole cached context.
//! Decodes keep kvc's kernels.
//!
//! Over an FP8 pool (`--kv-cache-dtype fp8`) a step whose prefill chunks
//! have no cached context (a prompt's first chunk) runs cuDNN's FP8
//! attention: Q quantized to e4m3 over a static per-layer scale (its
//! bound, see [`q_absmax`]), K/V gathered as the pool's e4m3 bytes with the
//! layer's scales, the softmax probabilities and O in e4m3 (O over the
//! V scale: |O| <= max |V|), widened to bf16 for o_proj. cuDNN's FP8
//! forward on Hopper aligns the causal mask top-left only and writes e4m3
//! only, so a chunk after cached context widens K/V to bf16 as before.
//! The route pays a fixed price per layer, so it is taken only from a
//! count of prompt tokens in the step ([`DEFAULT_FP8_BOUNDS`]; kvc-policy's
//! `fp8_attention` decision; `KVC_FP8_ATTENTION_MIN_TOKENS` through the
//! engine's kernel plan); `KVC_FP8_ATTENTION=0` keeps every step on the
//! bf16 route. Where the whole step is on it (`AttentionPlan::e4m3_io`),
//! RoPE writes Q in e4m3 itself and O stays e4m3 for an FP8 o_proj
//! ([`E4m3Output`]), so neither is widened and quantized again: that
//! price is lower, and so is the bound for such steps; beside decode rows
//! or cached chunks Q is quantized, V's amax taken and O widened in passes
//! of their own.
//!
//! The engine's kernel plan picks the route (`KVC_ATTENTION_BACKEND`, as
//! vLLM's `VLLM_ATTENTION_BACKEND`, requests it, read once at start):
//! `cudnn` (default), `cudnn-paged`, or `kvc` (kvc's kernels only).
//! Where cuDNN cannot be loaded or has no engine for a shape, the step
//! falls back to kvc's kernels with one warning.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::cuda::WrapErr;
use candle_core::{bail, DType, Device, Result, Tensor};
use cudnn_sys::{Cudnn, Fp8Scales, SdpaArgs, SdpaDesc, SdpaGraph};
use kvc_policy::fp8_attention::{decide_fp8_attention, Fp8Attention, Fp8AttentionBounds, Fp8AttentionInputs};
use kvc_policy::log_decision;

use super::{cuda_dev, empty, grid1, launch, ptr, upload_u32, CacheFormat, Kernels};
use crate::batch::SeqChunk;

/// The route for prefill-shaped attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillBackend {
    /// kvc's own kernels for everything.
    Kvc,
    /// cuDNN over K/V gathered from the pool into contiguous buffers.
    Cudnn,
    /// cuDNN reading K/V in place through page tables.
    CudnnPaged,
}

/// 0: `Cudnn` (the default), 1: `CudnnPaged`, 2: `Kvc`.
static PREFILL_BACKEND: AtomicU8 = AtomicU8::new(0);

impl PrefillBackend {
    /// The route models built from now on take (set by the engine's kernel
    /// plan at load; unset: `Cudnn`).
    pub fn current() -> Self {
        match PREFILL_BACKEND.load(Ordering::Relaxed) {
            1 => Self::CudnnPaged,
            2 => Self::Kvc,
            _ => Self::Cudnn,
        }
    }

    /// Chooses the route of the models built from now on.
    pub fn set_current(self) {
        PREFILL_BACKEND.store(
            match self {
                Self::Cudnn => 0,
                Self::CudnnPaged => 1,
                Self::Kvc => 2,
            },
            Ordering::Relaxed,
        );
    }
}

/// Sequences of at least this many query rows (tokens x query heads of a
/// KV head's group) go to cuDNN; shorter ones are decode-shaped.
pub(crate) const MIN_CUDNN_ROWS: usize = 17;

/// Padded extents of a graph: powers of two from 64, so a handful of
/// graphs serve every step (rows past a sequence's length are masked).
fn bucket(n: usize) -> usize {
    n.max(64).next_power_of_two()
}

/// Prompt tokens a step needs in its fresh chunks before cuDNN's FP8
/// attention pays for its passes, per kind of step (kvc-policy's measured
/// defaults).
pub const DEFAULT_FP8_BOUNDS: Fp8AttentionBounds = Fp8AttentionBounds::DEFAULT;

/// Bounds in two atomic words (mixed, whole step): `usize::MAX` in both
/// for None (off).
struct BoundsWords([AtomicUsize; 2]);

impl BoundsWords {
    const fn new(b: Option<Fp8AttentionBounds>) -> Self {
        let [m, w] = Self::words(b);
        Self([AtomicUsize::new(m), AtomicUsize::new(w)])
    }

    const fn words(b: Option<Fp8AttentionBounds>) -> [usize; 2] {
        match b {
            None => [usize::MAX; 2],
            Some(b) => [Self::bound(b.mixed), Self::bound(b.whole_step)],
        }
    }

    const fn bound(n: usize) -> usize {
        if n == usize::MAX {
            usize::MAX - 1
        } else {
            n
        }
    }

    fn store(&self, b: Option<Fp8AttentionBounds>) {
        for (word, v) in self.0.iter().zip(Self::words(b)) {
            word.store(v, Ordering::Relaxed);
        }
    }

    fn load(&self) -> Option<Fp8AttentionBounds> {
        let [m, w] = [0, 1].map(|i| self.0[i].load(Ordering::Relaxed));
        (m != usize::MAX).then_some(Fp8AttentionBounds { mixed: m, whole_step: w })
    }
}

/// The bounds of the handles opened from now on.
static FP8_BOUNDS: BoundsWords = BoundsWords::new(Some(DEFAULT_FP8_BOUNDS));

/// From how many prompt tokens in a step plans over an FP8 pool take
/// cuDNN's FP8 attention; None: never. The engine's kernel plan sets it
/// (`KVC_FP8_ATTENTION`, `KVC_FP8_ATTENTION_MIN_TOKENS`); unset,
/// [`DEFAULT_FP8_BOUNDS`].
pub fn fp8_attention_bounds() -> Option<Fp8AttentionBounds> {
    FP8_BOUNDS.load()
}

/// Sets [`fp8_attention_bounds`] for the cuDNN handles opened from now
/// on (a model's at load; the kernel plan, tests and benchmarks).
pub fn set_fp8_attention_bounds(b: Option<Fp8AttentionBounds>) {
    FP8_BOUNDS.store(b);
}

static E4M3_IO_PLANS: AtomicU64 = AtomicU64::new(0);

/// Plans so far whose every row was on the FP8 route (e4m3 Q from RoPE, e4m3
/// O into o_proj: [`CudnnPlan::fp8_row_count`] covering the batch).
pub fn e4m3_io_plans() -> u64 {
    E4M3_IO_PLANS.load(Ordering::Relaxed)
}

pub(crate) fn count_e4m3_io_plan() {
    E4M3_IO_PLANS.fetch_add(1, Ordering::Relaxed);
}

/// Whether a step's cuDNN sequences over an FP8 pool take the FP8 route
/// (kvc-policy's `fp8_attention` decision, logged and counted), before
/// cuDNN is asked for the graph.
fn fp8_route(seqs: &[&SeqChunk], step_tokens: usize, head_dim: usize, bounds: Option<Fp8AttentionBounds>) -> bool {
    let tokens = seqs.iter().map(|s| s.len).sum();
    let d = decide_fp8_attention(&Fp8AttentionInputs {
        bounds,
        head_dim,
        fresh: seqs.iter().all(|s| s.context_len == s.len),
        whole_step: tokens == step_tokens,
        tokens,
    });
    log_decision(&d);
    d.reason.route() == Fp8Attention::Fp8
}

/// A cuDNN handle and the plans built so far, one per shape bucket.
pub struct CudnnAttention {
    cudnn: Cudnn,
    paged: bool,
    /// [`fp8_attention_bounds`] at open.
    fp8_bounds: BoundsWords,
    /// None: cuDNN has no engine for that shape (said once, then kvc's kernels).
    graphs: Mutex<HashMap<SdpaDesc, Option<Arc<SdpaGraph>>>>,
}

impl CudnnAttention {
    /// Opens cuDNN for `backend`; None (with a warning) where it is off or
    /// cannot be loaded.
    pub fn open(backend: PrefillBackend, device: &Device) -> Option<Arc<Self>> {
        if backend == PrefillBackend::Kvc {
            return None;
        }
        let opened = cuda_dev(device)
            .and_then(|d| d.cuda_stream().context().bind_to_thread().w())
            .map_err(|e| e.to_string())
            .and_then(|_| Cudnn::open().map_err(|e| e.to_string()));
        match opened {
            Ok(cudnn) => {
                let paged = backend == PrefillBackend::CudnnPaged;
                let fp8_bounds = fp8_attention_bounds();
                tracing::info!(version = cudnn.version(), paged, ?fp8_bounds, "prefill attention on cuDNN");
                let fp8_bounds = BoundsWords::new(fp8_bounds);
                Some(Arc::new(Self { cudnn, paged, fp8_bounds, graphs: Mutex::new(HashMap::new()) }))
            }
            Err(e) => {
                tracing::warn!("prefill attention on kvc's kernels: {e}");
                None
            }
        }
    }

    /// Builds the single-sequence graphs of every query bucket up to
    /// `max_tokens` at load, so that serving does not stall on them: the
    /// first graph of a kind compiles its kernels (about a second, measured
    /// on an H200 with cuDNN 9.19), later ones of other sizes take tens of
    /// milliseconds. Gathered route only (a paged graph's shape includes
    /// the pool's size).
    pub fn warm_up(&self, nh: usize, nkv: usize, hd: usize, max_tokens: usize) {
        if self.paged || hd % 8 != 0 || hd > 256 {
            return;
        }
        let t0 = Instant::now();
        let mut s = 64;
        while s <= bucket(max_tokens) {
            let _ = self.graph(desc(1, nh, nkv, hd, s, s, None, false));
            s *= 2;
        }
        tracing::info!(ms = t0.elapsed().as_secs_f64() * 1e3, "cuDNN attention graphs warmed up");
    }

    /// From how many prompt tokens plans built from now on over an FP8
    /// pool take cuDNN's FP8 attention; None: never.
    pub fn set_fp8_bounds(&self, b: Option<Fp8AttentionBounds>) {
        self.fp8_bounds.store(b);
    }

    fn fp8_bounds(&self) -> Option<Fp8AttentionBounds> {
        self.fp8_bounds.load()
    }

    /// The plan for `desc`, built on first use.
    fn graph(&self, desc: SdpaDesc) -> Option<Arc<SdpaGraph>> {
        let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = graphs.get(&desc) {
            return g.clone();
        }
        let t0 = Instant::now();
        let built = match self.cudnn.build(&desc) {
            Ok(g) => {
                tracing::info!(
                    b = desc.b,
                    s_q = desc.s_q,
                    s_kv = desc.s_kv,
                    paged = desc.paged,
                    fp8 = desc.fp8,
                    workspace = g.workspace,
                    ms = t0.elapsed().as_secs_f64() * 1e3,
                    "cuDNN attention graph built"
                );
                Some(Arc::new(g))
            }
            Err(e) => {
                tracing::warn!(?desc, "cuDNN attention graph unavailable, kvc's kernels take this shape: {e}");
                None
            }
        };
        graphs.insert(desc, built.clone());
        built
    }
}

/// The graph shape of `b` sequences of at most `s_q` new tokens over at
/// most `s_kv` of context; `pool`: (blocks, block size) of the pool read in
/// place, None for gathered K/V; `fp8`: e4m3 operands.
#[allow(clippy::too_many_arguments)]
fn desc(b: usize, nh: usize, nkv: usize, hd: usize, s_q: usize, s_kv: usize, pool: Option<(usize, usize)>, fp8: bool) -> SdpaDesc {
    let (num_blocks, bs) = pool.unwrap_or((0, 0));
    SdpaDesc {
        b: b as i64,
        h_q: nh as i64,
        h_kv: nkv as i64,
        d: hd as i64,
        s_q: s_q as i64,
        s_kv: s_kv as i64,
        paged: pool.is_some() as i32,
        num_blocks: num_blocks as i64,
        block_size: bs as i64,
        block_stride: (2 * bs * nkv * hd) as i64,
        table_len: if bs > 0 { s_kv.div_ceil(bs) as i64 } else { 0 },
        scale_bits: (1.0 / (hd as f32).sqrt()).to_bits(),
        fp8: fp8 as i32,
    }
}

/// A bound on every element of a layer's queries, for their static e4m3
/// scale: q_norm's output is at most sqrt(head_dim) x max |weight| in each
/// element (a normalised vector's element is at most sqrt(n) times its
/// RMS), RoPE rotates pairs of elements (a pair's length is at most that
/// bound too) and scales by `rope_scale` (YaRN's attention factor).
pub fn q_absmax(head_dim: usize, q_norm_absmax: f32, rope_scale: f32) -> f32 {
    (head_dim as f32).sqrt() * q_norm_absmax * rope_scale.abs().max(1.0)
}

/// What the model's layout adds to a batch for cuDNN.
#[derive(Clone, Copy)]
pub struct PrefillContext<'a> {
    pub attention: &'a Arc<CudnnAttention>,
    /// An FP8 pool is always gathered (widened to bf16 for cuDNN).
    pub fp8_cache: bool,
    pub head_dim: usize,
    pub block_size: usize,
    pub num_blocks: usize,
}

/// The prefill-shaped part of one step, uploaded once and run by every layer.
pub struct CudnnPlan {
    attention: Arc<CudnnAttention>,
    graph: Arc<SdpaGraph>,
    seq_len_q: Tensor,
    seq_len_kv: Tensor,
    q_offsets: Tensor,
    /// Ragged: element offsets of each sequence's K/V in the gathered buffers.
    kv_offsets: Option<Tensor>,
    /// Ragged: pool slot of every gathered token, sequence after sequence.
    slots: Option<Tensor>,
    kv_tokens: usize,
    /// Paged: `[b][table_len]` block ids.
    table: Option<Tensor>,
    /// FP8: the batch's token rows of the plan's sequences (the rows the
    /// e4m3 O is widened back into).
    fp8_rows: Option<Tensor>,
    fp8_row_count: usize,
}

impl CudnnPlan {
    /// The plan for `seqs` (all prefill-shaped), or None where cuDNN has no
    /// engine for their shape.
    /// `step_tokens`: every row of the step (the FP8 route's bound depends
    /// on whether `seqs` are all of them).
    pub fn new(
        ctx: PrefillContext,
        seqs: &[&SeqChunk],
        step_tokens: usize,
        nh: usize,
        nkv: usize,
        device: &Device,
    ) -> Result<Option<Self>> {
        let hd = ctx.head_dim;
        if seqs.is_empty() || hd % 8 != 0 || hd > 256 {
            return Ok(None);
        }
        let b = seqs.len();
        let s_q = bucket(seqs.iter().map(|s| s.len).max().unwrap_or(1));
        let s_kv = bucket(seqs.iter().map(|s| s.context_len).max().unwrap_or(1));
        let bs = ctx.block_size;
        let paged = ctx.attention.paged && !ctx.fp8_cache;
        // FP8 when every chunk starts its sequence (top-left causal is
        // then bottom-right), there are enough of them, and cuDNN has an
        // FP8 engine for the shape.
        let fp8_graph = if ctx.fp8_cache && fp8_route(seqs, step_tokens, hd, ctx.attention.fp8_bounds()) {
            ctx.attention.graph(desc(b, nh, nkv, hd, s_q, s_kv, None, true))
        } else {
            None
        };
        let fp8 = fp8_graph.is_some();
        let shape = desc(b, nh, nkv, hd, s_q, s_kv, paged.then_some((ctx.num_blocks, bs)), false);
        let table_len = shape.table_len as usize;
        let Some(graph) = fp8_graph.or_else(|| ctx.attention.graph(shape)) else { return Ok(None) };
        let row_q = (nh * hd) as i64;
        let mut q_offsets: Vec<i64> = seqs.iter().map(|s| s.start as i64 * row_q).collect();
        let last = seqs[b - 1];
        q_offsets.push((last.start + last.len) as i64 * row_q);
        let u32s = |f: &dyn Fn(&SeqChunk) -> usize| seqs.iter().map(|s| f(s) as u32).collect::<Vec<_>>();
        let (mut kv_offsets, mut slots, mut table) = (None, None, None);
        let mut kv_tokens = 0;
        if paged {
            let mut t = Vec::with_capacity(b * table_len);
            for s in seqs {
                let n = s.context_len.div_ceil(bs);
                t.extend(s.block_table[..n].iter().copied());
                t.resize(t.len() + table_len - n, 0);
            }
            table = Some(upload_u32(t, device)?);
        } else {
            let row_kv = (nkv * hd) as i64;
            let mut offs = Vec::with_capacity(b + 1);
            let mut sl = Vec::new();
            for s in seqs {
                offs.push(kv_tokens as i64 * row_kv);
                sl.extend((0..s.context_len).map(|p| (s.block_table[p / bs] as usize * bs + p % bs) as u32));
                kv_tokens += s.context_len;
            }
            offs.push(kv_tokens as i64 * row_kv);
            kv_offsets = Some(Tensor::from_vec(offs, b + 1, device)?);
            slots = Some(upload_u32(sl, device)?);
        }
        let rows: Vec<u32> =
            if fp8 { seqs.iter().flat_map(|s| (s.start..s.start + s.len).map(|r| r as u32)).collect() } else { Vec::new() };
        Ok(Some(Self {
            attention: ctx.attention.clone(),
            graph,
            fp8_row_count: rows.len(),
            fp8_rows: if fp8 { Some(upload_u32(rows, device)?) } else { None },
            seq_len_q: upload_u32(u32s(&|s| s.len), device)?,
            seq_len_kv: upload_u32(u32s(&|s| s.context_len), device)?,
            q_offsets: Tensor::from_vec(q_offsets, b + 1, device)?,
            kv_offsets,
            slots,
            kv_tokens,
            table,
        }))
    }

    /// Whether the plan runs cuDNN's FP8 attention.
    pub fn fp8(&self) -> bool {
        self.fp8_rows.is_some()
    }

    /// The batch rows an FP8 plan writes (0 for a bf16 plan).
    pub fn fp8_row_count(&self) -> usize {
        self.fp8_row_count
    }

    /// Writes the attention of the plan's sequences into their rows of
    /// `out` (`[tokens, nh * hd]` bf16, like `q`), reading one layer of
    /// the pool at `layer_ptr` (holding `cache`); `q_absmax` bounds every
    /// element of `q` (an FP8 plan's static Q scale, see [`q_absmax`]).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        k: &Kernels,
        q: &Tensor,
        out: &Tensor,
        layer_ptr: u64,
        cache: CacheFormat,
        q_absmax: Option<f32>,
        nkv: usize,
        hd: usize,
        block_size: usize,
    ) -> Result<()> {
        let Some(rows) = &self.fp8_rows else {
            return self.enqueue(k, q, out, None, layer_ptr, cache, nkv, hd, block_size);
        };
        let q_max = checked_q_absmax(q_absmax)?;
        let q8 = empty(cuda_dev(q.device())?, q.dims(), DType::U8)?;
        quantize_q(k, q, &q8, 448.0 / q_max)?;
        let o = self.run_e4m3(k, &q8, rows, layer_ptr, cache, q_max, nkv, hd, block_size)?;
        o.widen_into(k, out)
    }

    /// An FP8 plan over Q already in e4m3 (`q8`: u8 `[tokens, nh * hd]`,
    /// e4m3(q x 448 / q_absmax), as [`quantize_q`] or RoPE's e4m3 form
    /// writes it): O of the plan's rows in e4m3 with its scale.
    #[allow(clippy::too_many_arguments)]
    pub fn run_fp8(
        &self,
        k: &Kernels,
        q8: &Tensor,
        layer_ptr: u64,
        cache: CacheFormat,
        q_absmax: Option<f32>,
        nkv: usize,
        hd: usize,
        block_size: usize,
    ) -> Result<E4m3Output> {
        let Some(rows) = &self.fp8_rows else { bail!("an e4m3 Q for a plan off cuDNN's FP8 route") };
        self.run_e4m3(k, q8, rows, layer_ptr, cache, checked_q_absmax(q_absmax)?, nkv, hd, block_size)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_e4m3(
        &self,
        k: &Kernels,
        q8: &Tensor,
        rows: &Tensor,
        layer_ptr: u64,
        cache: CacheFormat,
        q_max: f32,
        nkv: usize,
        hd: usize,
        block_size: usize,
    ) -> Result<E4m3Output> {
        let CacheFormat::Fp8 { k_scale, v_scale } = cache else { bail!("an FP8 attention plan over a {cache:?} layer") };
        let dev = cuda_dev(q8.device())?;
        let cudnn = Fp8Scales { descale_q: q_max / 448.0, descale_k: k_scale, descale_v: v_scale, scale_o: 1.0 / v_scale };
        let mut scales = cudnn.to_device_order().to_vec();
        scales.extend([0.0, 1.0]); // V's amax byte (0 as u32 bits too), O's widening factor
        let out = E4m3Output {
            o: empty(dev, q8.dims(), DType::U8)?,
            scales: Tensor::from_vec(scales, 10, q8.device())?,
            rows: rows.clone(),
            row_count: self.fp8_row_count,
        };
        let f = Fp8Operands { out: &out, v_scale };
        self.enqueue(k, q8, &out.o, Some(&f), layer_ptr, cache, nkv, hd, block_size)?;
        Ok(out)
    }

    /// Queues the graph: Q from `q`, O into `out` (bf16, or e4m3 with `fp8`).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        k: &Kernels,
        q: &Tensor,
        out: &Tensor,
        fp8: Option<&Fp8Operands>,
        layer_ptr: u64,
        cache: CacheFormat,
        nkv: usize,
        hd: usize,
        block_size: usize,
    ) -> Result<()> {
        let dev = cuda_dev(q.device())?;
        let stream = dev.cuda_stream();
        let mut args = SdpaArgs {
            q: ptr(q)?,
            o: ptr(out)?,
            seq_len_q: ptr(&self.seq_len_q)?,
            seq_len_kv: ptr(&self.seq_len_kv)?,
            q_offsets: ptr(&self.q_offsets)?,
            ..Default::default()
        };
        // Buffers live until the end of this call; the stream orders their
        // reuse after cuDNN's kernels.
        let mut keep = Vec::new();
        if let (Some(slots), Some(offs)) = (&self.slots, &self.kv_offsets) {
            let row = nkv * hd;
            // bf16 buffers, or an FP8 plan's e4m3 bytes as they are in the
            // pool (the bf16 gather copying them in pairs, half the row).
            let (dtype, gather, copy_row, scale_args) = match fp8 {
                Some(_) => (DType::U8, k.cache(CacheFormat::Bf16), row / 2, Vec::new()),
                None => (DType::BF16, k.cache(cache), row, cache.scale_args()),
            };
            let kb = empty(dev, (self.kv_tokens.max(1), row), dtype)?;
            let vb = empty(dev, (self.kv_tokens.max(1), row), dtype)?;
            if self.kv_tokens > 0 {
                launch!(
                    gather.kv_gather,
                    grid1(self.kv_tokens * row * cache.elem_bytes() / 16, 256);
                    &scale_args,
                    layer_ptr,
                    ptr(slots)?,
                    self.kv_tokens as i32,
                    ptr(&kb)?,
                    ptr(&vb)?,
                    copy_row as i32,
                    block_size as i32
                )?;
            }
            if let Some(f) = fp8 {
                f.scale_o_from(k, &vb, self.kv_tokens * row)?;
            }
            args.k = ptr(&kb)?;
            args.v = ptr(&vb)?;
            args.kv_offsets = ptr(offs)?;
            keep.push(kb);
            keep.push(vb);
        } else if let Some(table) = &self.table {
            if cache != CacheFormat::Bf16 {
                bail!("cuDNN reads a bf16 pool in place, not {cache:?} (an FP8 plan gathers)");
            }
            args.k = layer_ptr;
            args.v = layer_ptr + (block_size * nkv * hd * 2) as u64;
            args.page_table = ptr(table)?;
        }
        if let Some(f) = fp8 {
            args.scales = ptr(&f.out.scales)?;
        }
        if self.graph.workspace > 0 {
            let ws = empty(dev, self.graph.workspace.div_ceil(4), DType::F32)?;
            args.workspace = ptr(&ws)?;
            keep.push(ws);
        }
        stream.context().bind_to_thread().w()?;
        // SAFETY: every pointer is a live allocation of the graph's shape on
        // this device (q/out rows of the batch, the layer's pool, this
        // plan's buffers); they outlive the enqueue, and freed ones are
        // reused only in stream order.
        unsafe { self.attention.cudnn.run(&self.graph, stream.cu_stream() as *mut std::ffi::c_void, &args) }
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        drop(keep);
        Ok(())
    }
}

/// `q_absmax` where it can scale Q.
fn checked_q_absmax(q_absmax: Option<f32>) -> Result<f32> {
    match q_absmax.filter(|m| m.is_finite() && *m > 0.0) {
        Some(m) => Ok(m),
        None => bail!("cuDNN's FP8 attention needs a bound on |q| (PagedAttention::q_absmax), got {q_absmax:?}"),
    }
}

/// `q8 = e4m3(q x inv)` for bf16 `q` (elements a multiple of 8) into u8
/// `q8` of as many elements: cuDNN's FP8 attention's Q.
pub fn quantize_q(k: &Kernels, q: &Tensor, q8: &Tensor, inv: f32) -> Result<()> {
    let n = q.elem_count();
    if q.dtype() != DType::BF16 || q8.dtype() != DType::U8 || q8.elem_count() != n || n % 8 != 0 {
        bail!("e4m3 Q: bf16 {:?} into u8 {:?} (elements a multiple of 8)", q.shape(), q8.shape());
    }
    launch!(k.bf16_to_e4m3, grid1(n / 8, 256); &[], ptr(q)?, ptr(q8)?, (n / 8) as u64, inv)
}

/// cuDNN's FP8 attention output: O of the plan's rows in e4m3, worth
/// `scales[9]` (a device float: O's scale comes from V's amax) a unit.
pub struct E4m3Output {
    /// u8 `[tokens, nh * hd]`: the plan's rows written.
    pub o: Tensor,
    /// cuDNN's eight floats (`Fp8Scales`), V's largest e4m3 byte
    /// (`e4m3_amax`) and the factor that widens O (`fp8_o_scale`).
    scales: Tensor,
    /// The token rows cuDNN writes.
    rows: Tensor,
    row_count: usize,
}

impl E4m3Output {
    /// The device address of O's widening factor.
    fn widen_ptr(&self) -> Result<u64> {
        Ok(ptr(&self.scales)? + 9 * 4)
    }

    /// O's rows widened into those rows of bf16 `out` (same shape as `o`).
    pub fn widen_into(&self, k: &Kernels, out: &Tensor) -> Result<()> {
        let row = out.dim(1)?;
        if self.row_count == 0 {
            return Ok(());
        }
        launch!(
            k.e4m3_rows_to_bf16,
            grid1(self.row_count * row / 16, 256); &[],
            ptr(&self.o)?,
            ptr(&self.rows)?,
            self.row_count as i32,
            row as i32,
            self.widen_ptr()?,
            ptr(out)?
        )
    }

    /// O widened to bf16 `[tokens, nh * hd]` (a plan covering every row).
    pub fn to_bf16(&self, k: &Kernels) -> Result<Tensor> {
        let out = empty(cuda_dev(self.o.device())?, self.o.dims(), DType::BF16)?;
        self.widen_into(k, &out)?;
        Ok(out)
    }

    /// O's scale spread over `[tokens, nh * hd / group]` f32: the per-token,
    /// per-group activation scales an FP8 GEMM takes, all equal here.
    pub fn group_scales(&self, k: &Kernels, group: usize) -> Result<Tensor> {
        let (t, row) = self.o.dims2()?;
        let s = empty(cuda_dev(self.o.device())?, (t, row.div_ceil(group)), DType::F32)?;
        let n = s.elem_count();
        if n > 0 {
            launch!(k.fill_from, grid1(n, 256); &[], self.widen_ptr()?, ptr(&s)?, n as u64)?;
        }
        Ok(s)
    }
}

/// What an FP8 run adds: O with its scales, and V's layer scale.
struct Fp8Operands<'a> {
    out: &'a E4m3Output,
    v_scale: f32,
}

impl Fp8Operands<'_> {
    /// Scale O from the largest of V's `n` gathered e4m3 bytes `v`.
    fn scale_o_from(&self, k: &Kernels, v: &Tensor, n: usize) -> Result<()> {
        let amax = ptr(&self.out.scales)? + 8 * 4;
        if n > 0 {
            launch!(k.e4m3_amax, grid1(n / 16, 256); &[], ptr(v)?, (n / 16) as u64, amax)?;
        }
        launch!(k.fp8_o_scale, grid1(1, 32); &[], ptr(&self.out.scales)?, self.v_scale)
    }
}
