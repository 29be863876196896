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
use cudnn_sys::{Cudnn, SdpaArgs, SdpaDesc, SdpaGraph};

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
                tracing::info!(version = cudnn.version(), paged = backend == PrefillBackend::CudnnPaged, "prefill attention on cuDNN");
                Some(Arc::new(Self { cudnn, paged: backend == PrefillBackend::CudnnPaged, graphs: Mutex::new(HashMap::new()) }))
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
            let _ = self.graph(desc(1, nh, nkv, hd, s, s, None));
            s *= 2;
        }
        tracing::info!(ms = t0.elapsed().as_secs_f64() * 1e3, "cuDNN attention graphs warmed up");
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
/// place, None for gathered K/V.
fn desc(b: usize, nh: usize, nkv: usize, hd: usize, s_q: usize, s_kv: usize, pool: Option<(usize, usize)>) -> SdpaDesc {
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
}

impl CudnnPlan {
    /// The plan for `seqs` (all prefill-shaped), or None where cuDNN has no
    /// engine for their shape.
    pub fn new(ctx: PrefillContext, seqs: &[&SeqChunk], nh: usize, nkv: usize, device: &Device) -> Result<Option<Self>> {
        let hd = ctx.head_dim;
        if seqs.is_empty() || hd % 8 != 0 || hd > 256 {
            return Ok(None);
        }
        let b = seqs.len();
        let s_q = bucket(seqs.iter().map(|s| s.len).max().unwrap_or(1));
        let s_kv = bucket(seqs.iter().map(|s| s.context_len).max().unwrap_or(1));
        let bs = ctx.block_size;
        let paged = ctx.attention.paged && !ctx.fp8_cache;
        let shape = desc(b, nh, nkv, hd, s_q, s_kv, paged.then_some((ctx.num_blocks, bs)));
        let table_len = shape.table_len as usize;
        let Some(graph) = ctx.attention.graph(shape) else { return Ok(None) };
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
        Ok(Some(Self {
            attention: ctx.attention.clone(),
            graph,
            seq_len_q: upload_u32(u32s(&|s| s.len), device)?,
            seq_len_kv: upload_u32(u32s(&|s| s.context_len), device)?,
            q_offsets: Tensor::from_vec(q_offsets, b + 1, device)?,
            kv_offsets,
            slots,
            kv_tokens,
            table,
        }))
    }

    /// Writes the attention of the plan's sequences into their rows of
    /// `out` (`[tokens, nh * hd]` bf16, like `q`), reading one layer of
    /// the pool at `layer_ptr` (holding `cache`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        k: &Kernels,
        q: &Tensor,
        out: &Tensor,
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
            let kb = empty(dev, (self.kv_tokens.max(1), row), DType::BF16)?;
            let vb = empty(dev, (self.kv_tokens.max(1), row), DType::BF16)?;
            if self.kv_tokens > 0 {
                launch!(
                    k.cache(cache).kv_gather,
                    grid1(self.kv_tokens * row * cache.elem_bytes() / 16, 256);
                    &cache.scale_args(),
                    layer_ptr,
                    ptr(slots)?,
                    self.kv_tokens as i32,
                    ptr(&kb)?,
                    ptr(&vb)?,
                    row as i32,
                    block_size as i32
                )?;
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
