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
//! bound, see [`q_absmax`](super::cudnn_fp8::q_absmax)), K/V gathered as
//! the pool's e4m3 bytes with the layer's scales, the softmax
//! probabilities and O in e4m3 (O over the V scale: |O| <= max |V|),
//! widened to bf16 for o_proj. cuDNN's FP8 forward on Hopper aligns the
//! causal mask top-left only and writes e4m3 only, so a chunk after cached
//! context widens K/V to bf16 as before. The route pays a fixed price per
//! layer, so it is taken only from a count of prompt tokens in the step
//! (kvc-policy's `fp8_attention` decision over
//! [`DEFAULT_FP8_BOUNDS`](super::cudnn_fp8::DEFAULT_FP8_BOUNDS);
//! `KVC_FP8_ATTENTION_MIN_TOKENS` through the engine's kernel plan);
//! `KVC_FP8_ATTENTION=0` keeps every step on the bf16 route. Where the
//! whole step is on it (`AttentionPlan::e4m3_io`), RoPE writes Q in e4m3
//! itself and O stays e4m3 for an FP8 o_proj ([`E4m3Output`]), so neither
//! is widened and quantized again: that price is lower, and so is the
//! bound for such steps; beside decode rows or cached chunks Q is
//! quantized, V's amax taken and O widened in passes of their own. Those
//! FP8 pieces live in cudnn_fp8.rs.
//!
//! The engine's kernel plan picks the route (`KVC_ATTENTION_BACKEND`, as
//! vLLM's `VLLM_ATTENTION_BACKEND`, requests it, read once at start):
//! `cudnn` (default), `cudnn-paged`, or `kvc` (kvc's kernels only).
//! Where cuDNN cannot be loaded or has no engine for a shape, the step
//! falls back to kvc's kernels with one warning.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::cuda::WrapErr;
use candle_core::{bail, DType, Device, Result, Tensor};
use cudnn_sys::{Cudnn, Fp8Scales, SdpaArgs, SdpaDesc, SdpaGraph};
use kvc_policy::fp8_attention::Fp8AttentionBounds;

use super::cudnn_fp8::{
    checked_q_absmax, count_e4m3_io_plan, fp8_attention_bounds, fp8_route, quantize_q, E4m3Output, Fp8Bounds, Fp8Operands,
};
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

/// A cuDNN handle and the plans built so far, one per shape bucket.
pub struct CudnnAttention {
    cudnn: Cudnn,
    paged: bool,
    /// [`fp8_attention_bounds`] at open.
    fp8_bounds: Fp8Bounds,
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
                let fp8_bounds = Fp8Bounds::new(fp8_bounds);
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
        self.fp8_bounds.set(b);
    }

    fn fp8_bounds(&self) -> Option<Fp8AttentionBounds> {
        self.fp8_bounds.get()
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
    /// FP8 over every row of the step: Q comes from RoPE in e4m3 and O goes
    /// to o_proj in e4m3.
    e4m3_io: bool,
}

/// The layer a plan runs over: its pool memory and what it holds.
#[derive(Debug, Clone, Copy)]
pub struct LayerArgs {
    /// Device address of the layer's first block.
    pub layer_ptr: u64,
    pub cache: CacheFormat,
    /// A bound on every element of the layer's queries (an FP8 plan's
    /// static Q scale, see [`q_absmax`](super::cudnn_fp8::q_absmax)); None where unknown.
    pub q_absmax: Option<f32>,
    pub nkv: usize,
    pub hd: usize,
    pub block_size: usize,
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
        let whole_step = seqs.iter().map(|s| s.len).sum::<usize>() == step_tokens;
        let fp8_graph = if ctx.fp8_cache && fp8_route(seqs, whole_step, hd, ctx.attention.fp8_bounds()) {
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
        if fp8 && whole_step {
            count_e4m3_io_plan();
        }
        Ok(Some(Self {
            attention: ctx.attention.clone(),
            graph,
            e4m3_io: fp8 && whole_step,
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

    /// Whether the plan is FP8 and its sequences are every row of the step
    /// (e4m3 Q in, e4m3 O out: `AttentionPlan::e4m3_io`).
    pub fn e4m3_io(&self) -> bool {
        self.e4m3_io
    }

    /// The batch rows an FP8 plan writes (0 for a bf16 plan).
    pub fn fp8_row_count(&self) -> usize {
        self.fp8_row_count
    }

    /// Writes the attention of the plan's sequences into their rows of
    /// `out` (`[tokens, nh * hd]` bf16, like `q`), reading `layer` of the
    /// pool (whose `q_absmax` bounds every element of `q` for an FP8 plan).
    pub fn run(&self, k: &Kernels, q: &Tensor, out: &Tensor, layer: &LayerArgs) -> Result<()> {
        let Some(rows) = &self.fp8_rows else {
            return self.enqueue(k, q, out, None, layer);
        };
        let q_max = checked_q_absmax(layer.q_absmax)?;
        let q8 = empty(cuda_dev(q.device())?, q.dims(), DType::U8)?;
        quantize_q(k, q, &q8, 448.0 / q_max)?;
        let o = self.run_e4m3(k, &q8, rows, layer, q_max)?;
        o.widen_into(k, out)
    }

    /// An FP8 plan over Q already in e4m3 (`q8`: u8 `[tokens, nh * hd]`,
    /// e4m3(q x 448 / q_absmax), as [`quantize_q`] or RoPE's e4m3 form
    /// writes it): O of the plan's rows in e4m3 with its scale.
    pub fn run_fp8(&self, k: &Kernels, q8: &Tensor, layer: &LayerArgs) -> Result<E4m3Output> {
        let Some(rows) = &self.fp8_rows else { bail!("an e4m3 Q for a plan off cuDNN's FP8 route") };
        self.run_e4m3(k, q8, rows, layer, checked_q_absmax(layer.q_absmax)?)
    }

    fn run_e4m3(&self, k: &Kernels, q8: &Tensor, rows: &Tensor, layer: &LayerArgs, q_max: f32) -> Result<E4m3Output> {
        let CacheFormat::Fp8 { k_scale, v_scale } = layer.cache else { bail!("an FP8 attention plan over a {:?} layer", layer.cache) };
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
        self.enqueue(k, q8, &out.o, Some(&f), layer)?;
        Ok(out)
    }

    /// Queues the graph: Q from `q`, O into `out` (bf16, or e4m3 with `fp8`).
    fn enqueue(&self, k: &Kernels, q: &Tensor, out: &Tensor, fp8: Option<&Fp8Operands>, layer: &LayerArgs) -> Result<()> {
        let LayerArgs { layer_ptr, cache, nkv, hd, block_size, .. } = *layer;
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
