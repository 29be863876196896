//! Paged attention on the GPU: the host plans work items over the batch
//! (query tiles, and KV-length splits for decodes when the batch alone
//! would not fill the GPU), one kernel attends, a second merges splits.
//! Decode-shaped items (at most 16 rows) run on their own kernel:
//! `paged_decode2` by default, which merges its splits itself, or the
//! older `paged_decode` (`KVC_DECODE_KERNEL=v1`), merged by `attn_combine`.

use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{bail, DType, Device, Result, Tensor};

use super::cudnn_attention::{CudnnPlan, LayerArgs, PrefillContext, MIN_CUDNN_ROWS};
use super::cudnn_fp8::E4m3Output;
use super::{cuda_dev, empty, launch, launch_slices, overwrite_u32, ptr, upload_u32, CacheFormat, Kernels};
use crate::batch::{BatchInput, SeqChunk};

/// Rows (token x query head of a group) per work item, as in attention.cu.
const BR: usize = 64;
const BC: usize = 64;
/// CTAs that fill an H200 (132 SMs) about twice.
const TARGET_CTAS: usize = 264;
/// Shortest KV range a split covers.
const MIN_SPLIT: usize = 128;
/// Most splits one sequence is cut into (attn_combine's MAX_PARTS).
const MAX_SPLITS: usize = 512;

/// Dynamic shared memory of the attention kernel for a padded head dim.
pub(crate) fn smem_bytes(hd: usize) -> usize {
    // Padded strides as in attention.cu: LDQ = hd + 8, LDS = BC + 4, LDP = BC + 8.
    BR * (hd + 8) * 2 + 4 * BC * (hd + 8) * 2 + BR * (BC + 4) * 4 + BR * (BC + 8) * 2 + 3 * BR * 4
}

/// Dynamic shared memory of the decode kernel (16 rows, warps split keys).
pub(crate) fn decode_smem_bytes(hd: usize) -> usize {
    16 * (hd + 8) * 2 + 4 * BC * (hd + 8) * 2 + 4 * 16 * 20 * 4 + 4 * 16 * 24 * 2 + 3 * 4 * 16 * 4
}

/// Rows (tokens x group heads) up to which a work item runs on the decode kernel.
const DECODE_ROWS: usize = 16;

/// 0: not read yet, 1: `paged_decode` (v1), 2: `paged_decode2`.
static DECODE_KERNEL: AtomicU8 = AtomicU8::new(0);

/// Chooses the decode kernel of the plans made from now on: v1
/// (`paged_decode` + `attn_combine`) or v2 (`paged_decode2`, the default).
/// The engine's kernel plan sets it at load (`KVC_DECODE_KERNEL=v1`
/// requests v1); tests force each in turn.
pub fn set_decode_kernel_v1(on: bool) {
    DECODE_KERNEL.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether new plans use `paged_decode2` (unset: yes).
pub(crate) fn decode_v2() -> bool {
    DECODE_KERNEL.load(Ordering::Relaxed) != 1
}

/// SMs of an H200. `paged_decode2` at head dims 128 and 256 (the
/// production shapes) holds one CTA per SM, so a launch of up to this many
/// CTAs is one wave.
const SMS: usize = 132;
/// Keys per warp tile of `paged_decode2`: its split boundaries are
/// multiples of it.
const DECODE_TILE: usize = 16;
/// Shortest KV range of a `paged_decode2` split: two tiles per warp, so
/// that a split's work outweighs its share of the merge.
const DECODE_MIN_SPLIT: usize = 256;
/// Most splits of one `paged_decode2` group (MERGE_PARTS in attention.cu).
const DECODE_MAX_SPLITS: usize = 128;
/// What a CTA costs besides streaming its keys (start, Q, filling the
/// pipeline, its share of the merge), in keys one SM streams meanwhile:
/// the split choice weighs more waves against longer pieces with it.
const CTA_OVERHEAD_KEYS: usize = 256;

/// Warps per CTA and ring stages per warp of `paged_decode2` for a padded
/// head dim and cache format (dec2::Cfg in attention.cu).
fn decode2_shape(hd: usize, fp8: bool) -> (usize, usize) {
    (if hd == 256 { 4 } else { 8 }, if fp8 || hd < 64 { 4 } else { 3 })
}

/// Threads per CTA of `paged_decode2`.
pub(crate) fn decode2_threads(hd: usize) -> u32 {
    (decode2_shape(hd, false).0 * 32) as u32
}

/// Dynamic shared memory of `paged_decode2` (dec2::Cfg::SMEM; the kernel
/// traps if it is given less): per warp a ring of K/V tiles of 16 keys
/// (bf16 rows of hd + 8, or e4m3 rows of hd + 16 bytes, read in place),
/// then Q, the warps' row maxima, sums and weights, the CTA's row state
/// and a flag.
pub(crate) fn decode2_smem_bytes(hd: usize, fp8: bool) -> usize {
    let (warps, stages) = decode2_shape(hd, fp8);
    let ld = hd + 8;
    let pair = 2 * DECODE_TILE * ld * 2;
    let per_warp = if fp8 { stages * 2 * DECODE_TILE * (hd + 16) } else { stages * pair };
    warps * per_warp + DECODE_ROWS * ld * 2 + 3 * warps * DECODE_ROWS * 4 + 2 * DECODE_ROWS * 4 + 16
}

/// Length of each of `splits` ranges over `ctx` keys, in whole tiles.
fn split_len(ctx: usize, splits: usize) -> usize {
    ctx.div_ceil(splits.max(1)).div_ceil(DECODE_TILE) * DECODE_TILE
}

/// Modelled time of a `paged_decode2` launch, in keys one SM streams:
/// waves of CTAs, each as long as the longest piece plus its fixed cost.
fn decode_cost(ctxs: &[usize], splits: &[usize], num_kv_heads: usize) -> usize {
    let ctas = splits.iter().sum::<usize>() * num_kv_heads;
    let piece = ctxs.iter().zip(splits).map(|(&c, &s)| split_len(c, s)).max().unwrap_or(0);
    ctas.div_ceil(SMS) * (piece + CTA_OVERHEAD_KEYS)
}

/// Splits per decode-shaped sequence (contexts `ctxs`) for one
/// `paged_decode2` launch: the KV work spread evenly over 1 to 8 waves of
/// CTAs, each sequence cut into pieces of about that share (rounded down
/// or up), whichever [`decode_cost`] finds fastest. Long batches stay
/// whole (one wave per 132 sequence x KV head pairs), a lone long decode
/// is cut over every SM.
fn decode_splits(ctxs: &[usize], num_kv_heads: usize) -> Vec<usize> {
    let total = ctxs.iter().sum::<usize>() * num_kv_heads;
    let mut best: Option<(usize, Vec<usize>)> = None;
    for waves in 1..=8 {
        let len = total.div_ceil(waves * SMS).max(DECODE_MIN_SPLIT);
        for round_up in [false, true] {
            let splits: Vec<usize> =
                ctxs.iter().map(|&c| (if round_up { c.div_ceil(len) } else { c / len }).clamp(1, DECODE_MAX_SPLITS)).collect();
            let cost = decode_cost(ctxs, &splits, num_kv_heads);
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((cost, splits));
            }
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}

/// Appends the `paged_decode2` items of a decode-shaped sequence: one item
/// that writes its output when `splits` is 1, else `splits` ranges of
/// `len` keys (empty past the context: they count, and merge with weight
/// 0) in partial slots `parts..parts + splits`.
fn push_decode2(items: &mut Vec<u32>, parts: &mut u32, si: usize, s: &SeqChunk, splits: usize, len: usize) {
    let (n, ctx) = (s.len as u32, s.context_len);
    if splits <= 1 {
        items.extend([si as u32, 0, n, 0, ctx as u32, u32::MAX, 0, 0]);
        return;
    }
    let first = *parts;
    for p in 0..splits {
        let (b, e) = ((p * len).min(ctx), ((p + 1) * len).min(ctx));
        items.extend([si as u32, 0, n, b as u32, e as u32, first + p as u32, first, splits as u32]);
    }
    *parts += splits as u32;
}

/// The head dims the kernel is compiled for.
fn padded_head_dim(hd: usize) -> Result<usize> {
    match [16, 32, 64, 128, 256].into_iter().find(|&p| p >= hd) {
        Some(p) => Ok(p),
        None => bail!("head_dim {hd} > 256 is not supported by the attention kernel"),
    }
}

/// The work of one batch, uploaded once and used by every layer.
pub struct AttentionPlan {
    seqs: Tensor,
    tables: Tensor,
    items: Tensor,
    decode_items: Tensor,
    combine: Tensor,
    /// `paged_decode2`'s split counters, `[decode parts][kv heads]` u32:
    /// zero between launches (the last split of a group resets its own).
    counters: Tensor,
    num_items: usize,
    num_decode_items: usize,
    num_combine: usize,
    /// Partial slots merged by `attn_combine` (split `paged_attention`
    /// items, and v1 decode items).
    num_parts: usize,
    /// Partial slots of split `paged_decode2` items.
    num_decode_parts: usize,
    /// Decode items are `paged_decode2`'s (8 ints), not `paged_decode`'s (7).
    decode_v2: bool,
    num_heads: usize,
    num_kv_heads: usize,
    /// The prefill-shaped sequences, where cuDNN takes them.
    cudnn: Option<CudnnPlan>,
}

impl AttentionPlan {
    /// Every sequence on kvc's kernels.
    pub fn new(batch: &BatchInput, num_heads: usize, num_kv_heads: usize, device: &Device) -> Result<Self> {
        Self::with_prefill(batch, num_heads, num_kv_heads, None, device)
    }

    /// Prefill-shaped sequences on cuDNN where `prefill` is given and
    /// cuDNN has an engine for their shape; the rest on kvc's kernels.
    pub fn with_prefill(
        batch: &BatchInput,
        num_heads: usize,
        num_kv_heads: usize,
        prefill: Option<PrefillContext>,
        device: &Device,
    ) -> Result<Self> {
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > BR {
            bail!("attention: {num_heads} query heads over {num_kv_heads} KV heads is not supported");
        }
        let group = num_heads / num_kv_heads;
        let on_cudnn = |s: &SeqChunk| s.len * group >= MIN_CUDNN_ROWS;
        let cudnn = match prefill {
            Some(ctx) => {
                let seqs: Vec<&SeqChunk> = batch.seqs.iter().filter(|s| on_cudnn(s)).collect();
                CudnnPlan::new(ctx, &seqs, batch.tokens.len(), num_heads, num_kv_heads, device)?
            }
            None => None,
        };
        let kvc_takes = |s: &SeqChunk| cudnn.is_none() || !on_cudnn(s);
        let tok_per_tile = BR / group;
        let v2 = decode_v2();
        let mut seqs = Vec::with_capacity(batch.seqs.len() * 4);
        let mut tables = Vec::new();
        for s in &batch.seqs {
            seqs.extend([s.start as u32, s.len as u32, s.context_len as u32, tables.len() as u32]);
            tables.extend(s.block_table.iter().copied());
        }
        // With v2, a sequence whose rows fit one decode item is one
        // paged_decode2 group, split by decode_splits over that launch's
        // sequences alone (it runs apart from the prefill tiles).
        let whole = |s: &SeqChunk| v2 && s.len * group <= DECODE_ROWS;
        let dec_ctxs: Vec<usize> = batch.seqs.iter().filter(|s| whole(s)).map(|s| s.context_len).collect();
        let mut dec_splits = decode_splits(&dec_ctxs, num_kv_heads).into_iter();
        let tiles: usize = batch.seqs.iter().filter(|s| kvc_takes(s)).map(|s| s.len.div_ceil(tok_per_tile)).sum();
        let base_ctas = tiles * num_kv_heads;
        let (mut items, mut decode_items, mut combine) = (Vec::new(), Vec::new(), Vec::new());
        let (mut parts, mut decode_parts) = (0u32, 0u32);
        for (si, s) in batch.seqs.iter().enumerate().filter(|(_, s)| kvc_takes(s)) {
            let ctx = s.context_len;
            if whole(s) {
                let splits = dec_splits.next().unwrap_or(1);
                let len = split_len(ctx, splits);
                push_decode2(&mut decode_items, &mut decode_parts, si, s, ctx.div_ceil(len.max(1)), len);
                continue;
            }
            let mut splits = 1;
            if s.len <= tok_per_tile && base_ctas < TARGET_CTAS {
                splits = TARGET_CTAS.div_ceil(base_ctas).min(ctx.div_ceil(MIN_SPLIT)).clamp(1, MAX_SPLITS);
            }
            if splits > 1 {
                let split_len = ctx.div_ceil(splits).div_ceil(BC) * BC;
                let splits = ctx.div_ceil(split_len);
                combine.extend([si as u32, parts, splits as u32, s.len as u32]);
                let dst = if s.len * group <= DECODE_ROWS { &mut decode_items } else { &mut items };
                for p in 0..splits {
                    let (b, e) = (p * split_len, ((p + 1) * split_len).min(ctx));
                    dst.extend([si as u32, 0, s.len as u32, b as u32, e as u32, parts, 0]);
                    parts += 1;
                }
            } else {
                let mut off = 0;
                while off < s.len {
                    let n = tok_per_tile.min(s.len - off);
                    let it = [si as u32, off as u32, n as u32, 0, ctx as u32, u32::MAX, 0];
                    if n * group > DECODE_ROWS {
                        items.extend(it);
                    } else {
                        decode_items.extend(it);
                        if v2 {
                            decode_items.push(0); // paged_decode2's 8th int (nparts)
                        }
                    }
                    off += n;
                }
            }
        }
        Ok(Self {
            num_items: items.len() / 7,
            num_decode_items: decode_items.len() / if v2 { 8 } else { 7 },
            decode_items: upload_u32(decode_items, device)?,
            num_combine: combine.len() / 4,
            num_parts: parts as usize,
            num_decode_parts: decode_parts as usize,
            counters: upload_u32(vec![0; decode_parts as usize * num_kv_heads], device)?,
            decode_v2: v2,
            seqs: upload_u32(seqs, device)?,
            tables: upload_u32(tables, device)?,
            items: upload_u32(items, device)?,
            combine: upload_u32(combine, device)?,
            num_heads,
            num_kv_heads,
            cudnn,
        })
    }

    /// Whether cuDNN takes this plan's prefill-shaped sequences.
    pub fn uses_cudnn(&self) -> bool {
        self.cudnn.is_some()
    }

    /// Whether they run cuDNN's FP8 attention.
    pub fn uses_cudnn_fp8(&self) -> bool {
        self.cudnn.as_ref().is_some_and(|c| c.fp8())
    }

    /// Whether every row of the batch is on cuDNN's FP8 route: Q can come
    /// in e4m3 ([`PagedAttention::forward_fp8`]) and O stay e4m3.
    pub fn e4m3_io(&self) -> bool {
        self.cudnn.as_ref().is_some_and(CudnnPlan::e4m3_io)
    }
}

/// The paged KV cache of one layer as the kernels see it.
/// A decode batch's attention plan with launch shapes that depend only on
/// the batch size, for a CUDA graph: every sequence is cut into `splits`
/// KV ranges (the ones past its context are empty and merge with zero
/// weight). Block tables are packed one after another, into a device
/// buffer of at least their total length. The host vectors of
/// [`AttentionPlan`].
pub(crate) struct FixedPlanHost {
    pub seqs: Vec<u32>,
    pub tables: Vec<u32>,
    pub decode_items: Vec<u32>,
    pub combine: Vec<u32>,
    /// The items are `paged_decode2`'s (no combine items; the counters
    /// come with the device plan).
    pub decode_v2: bool,
    /// Partial slots of the `paged_decode2` items (0 without splits).
    pub decode_parts: usize,
}

/// Whether a decode of this model can run with a fixed plan: one token per
/// sequence must fit one decode work item.
pub(crate) fn fixed_plan_fits(num_heads: usize, num_kv_heads: usize) -> bool {
    num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_heads / num_kv_heads <= DECODE_ROWS
}

/// KV splits per sequence for a graph of `batch` decodes. v1: about
/// [`TARGET_CTAS`] work items over the KV heads, at most 64. v2: the
/// count that [`decode_cost`] finds fastest for sequences of a typical
/// context (4K), e.g. 32 at batch 1 (128 CTAs over 4 KV heads), 2 at 16,
/// 1 from 32 on; short contexts leave the splits past them empty.
pub(crate) fn fixed_splits(batch: usize, num_kv_heads: usize) -> usize {
    if !decode_v2() {
        return TARGET_CTAS.div_ceil(batch * num_kv_heads).clamp(1, 64);
    }
    let ctxs = vec![4096; batch.max(1)];
    (1..=DECODE_MAX_SPLITS).min_by_key(|&s| (decode_cost(&ctxs, &vec![s; ctxs.len()], num_kv_heads), s)).unwrap_or(1)
}

impl FixedPlanHost {
    /// `batch`: decodes only (one token each, sequence i at row i).
    pub fn new(batch: &BatchInput, splits: usize) -> Result<Self> {
        let n = batch.seqs.len();
        let v2 = decode_v2();
        let mut seqs = Vec::with_capacity(n * 4);
        let mut tables = Vec::new();
        let mut decode_items = Vec::with_capacity(n * splits * 8);
        let mut combine = Vec::with_capacity(n * 4);
        let mut decode_parts = 0u32;
        for (si, s) in batch.seqs.iter().enumerate() {
            if s.len != 1 || s.start != si {
                bail!("fixed attention plan: sequence {si} is not a decode at row {si}");
            }
            seqs.extend([si as u32, 1, s.context_len as u32, tables.len() as u32]);
            tables.extend_from_slice(s.block_table);
            let ctx = s.context_len;
            if v2 {
                // Every sequence has `splits` items (launch shape), in
                // splits of at least DECODE_MIN_SPLIT keys.
                push_decode2(&mut decode_items, &mut decode_parts, si, s, splits, split_len(ctx, splits).max(DECODE_MIN_SPLIT));
                continue;
            }
            let split_len = ctx.div_ceil(splits).div_ceil(BC) * BC;
            combine.extend([si as u32, (si * splits) as u32, splits as u32, 1]);
            for p in 0..splits {
                let (b, e) = ((p * split_len).min(ctx), ((p + 1) * split_len).min(ctx));
                decode_items.extend([si as u32, 0, 1, b as u32, e as u32, (si * splits + p) as u32, 0]);
            }
        }
        Ok(Self { seqs, tables, decode_items, combine, decode_v2: v2, decode_parts: decode_parts as usize })
    }

    /// Table entries of the batch.
    pub fn table_len(&self) -> usize {
        self.tables.len()
    }

    /// The device plan, allocated (at capture), with room for
    /// `table_capacity` table entries.
    pub fn upload(&self, num_heads: usize, num_kv_heads: usize, table_capacity: usize, device: &Device) -> Result<AttentionPlan> {
        let mut tables = self.tables.clone();
        tables.resize(table_capacity.max(tables.len()), 0);
        let v1_items = if self.decode_v2 { 0 } else { self.decode_items.len() / 7 };
        Ok(AttentionPlan {
            seqs: upload_u32(self.seqs.clone(), device)?,
            tables: upload_u32(tables, device)?,
            items: upload_u32(Vec::new(), device)?,
            decode_items: upload_u32(self.decode_items.clone(), device)?,
            combine: upload_u32(self.combine.clone(), device)?,
            counters: upload_u32(vec![0; self.decode_parts * num_kv_heads], device)?,
            num_items: 0,
            num_decode_items: self.decode_items.len() / if self.decode_v2 { 8 } else { 7 },
            num_combine: self.combine.len() / 4,
            num_parts: v1_items,
            num_decode_parts: self.decode_parts,
            decode_v2: self.decode_v2,
            num_heads,
            num_kv_heads,
            cudnn: None,
        })
    }

    /// Copies into a plan made by [`Self::upload`] for the same batch size
    /// and splits, with room for these tables (before a replay).
    pub fn write_into(&self, plan: &AttentionPlan) -> Result<()> {
        if plan.decode_v2 != self.decode_v2 || plan.num_decode_parts != self.decode_parts {
            bail!("fixed attention plan: the captured plan is for another decode kernel or split count");
        }
        overwrite_u32(&plan.seqs, &self.seqs)?;
        overwrite_u32(&plan.tables, &self.tables)?;
        overwrite_u32(&plan.decode_items, &self.decode_items)?;
        overwrite_u32(&plan.combine, &self.combine)
    }
}

pub struct PagedAttention {
    /// Device address of the layer's first block.
    pub layer_ptr: u64,
    /// What the layer holds.
    pub cache: CacheFormat,
    pub block_size: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// A bound on every element of the layer's queries
    /// (`cudnn_fp8::q_absmax`): cuDNN's FP8 attention quantizes Q
    /// over it; None where unknown (an FP8 plan then fails).
    pub q_absmax: Option<f32>,
}

impl PagedAttention {
    /// This layer as a cuDNN plan runs over it, with `nkv` KV heads.
    fn cudnn_layer(&self, nkv: usize) -> LayerArgs {
        LayerArgs {
            layer_ptr: self.layer_ptr,
            cache: self.cache,
            q_absmax: self.q_absmax,
            nkv,
            hd: self.head_dim,
            block_size: self.block_size,
        }
    }

    /// [`Self::forward`] for a plan whose every row is on cuDNN's FP8
    /// route ([`AttentionPlan::e4m3_io`]): `q8` u8 `[tokens, num_heads *
    /// head_dim]` holding e4m3(q x 448 / q_absmax) (RoPE's e4m3 form), O in
    /// e4m3 with its scale.
    pub fn forward_fp8(&self, k: &Kernels, q8: &Tensor, plan: &AttentionPlan) -> Result<E4m3Output> {
        let (nkv, hd) = (plan.num_kv_heads, self.head_dim);
        match &plan.cudnn {
            Some(c) if c.e4m3_io() && q8.dtype() == DType::U8 && q8.dims2()? == (c.fp8_row_count(), plan.num_heads * hd) => {
                c.run_fp8(k, q8, &self.cudnn_layer(nkv))
            }
            _ => bail!("attention: an e4m3 Q {:?} {:?} for a plan not wholly on cuDNN's FP8 route", q8.shape(), q8.dtype()),
        }
    }

    /// `q: [tokens, num_heads * head_dim]` bf16 -> attention output of the
    /// same shape, every sequence attending causally over its paged context.
    pub fn forward(&self, k: &Kernels, q: &Tensor, plan: &AttentionPlan) -> Result<Tensor> {
        let dev = cuda_dev(q.device())?;
        let (t, _) = q.dims2()?;
        let (nh, nkv, hd) = (plan.num_heads, plan.num_kv_heads, self.head_dim);
        if q.dtype() != DType::BF16 || q.dim(1)? != nh * hd {
            bail!("attention: q {:?} {:?} for {nh} heads of {hd}", q.shape(), q.dtype());
        }
        let hp = padded_head_dim(hd)?;
        if self.cache != CacheFormat::Bf16 && hd % 16 != 0 {
            bail!("attention over an FP8 KV cache needs a head dim that is a multiple of 16, not {hd}");
        }
        let kernels = k.cache(self.cache);
        let f = &kernels.attention.iter().find(|(p, _)| *p == hp).expect("compiled head dims").1;
        let fd = &kernels.decode.iter().find(|(p, _)| *p == hp).expect("compiled head dims").1;
        let out = empty(dev, (t, nh * hd), DType::BF16)?;
        // cuDNN first: kvc's kernels then write their rows after it.
        if let Some(c) = &plan.cudnn {
            c.run(k, q, &out, &self.cudnn_layer(nkv))?;
        }
        let parts = plan.num_parts.max(1) * nkv * BR;
        let part_o = if plan.num_parts > 0 { empty(dev, parts * hd, DType::F32)? } else { empty(dev, 1, DType::F32)? };
        let part_lse = if plan.num_parts > 0 { empty(dev, parts, DType::F32)? } else { empty(dev, 1, DType::F32)? };
        let v1_decode = if plan.decode_v2 { 0 } else { plan.num_decode_items };
        for (func, items, n, smem) in
            [(f, &plan.items, plan.num_items, smem_bytes(hp)), (fd, &plan.decode_items, v1_decode, decode_smem_bytes(hp))]
        {
            if n == 0 {
                continue;
            }
            let cfg = LaunchConfig { grid_dim: (n as u32, nkv as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
            let (ints, floats) = self.scalars(plan);
            launch_slices(func, cfg, &self.pointers(q, plan, items, &out, (&part_o, &part_lse))?, &ints, &floats)?;
        }
        if plan.decode_v2 {
            self.decode2(k, q, plan, &out, hp)?;
        }
        if plan.num_combine > 0 {
            let cfg =
                LaunchConfig { grid_dim: (plan.num_combine as u32, nkv as u32, BR as u32), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
            launch!(
                k.attn_combine,
                cfg,
                ptr(&part_o)?,
                ptr(&part_lse)?,
                ptr(&plan.seqs)?,
                ptr(&plan.combine)?,
                ptr(&out)?,
                nh as i32,
                nkv as i32,
                hd as i32
            )?;
        }
        Ok(out)
    }

    /// The decode items of a v2 plan on `paged_decode2`, into `out`; split
    /// items merge in the same launch.
    fn decode2(&self, k: &Kernels, q: &Tensor, plan: &AttentionPlan, out: &Tensor, hp: usize) -> Result<()> {
        if plan.num_decode_items == 0 {
            return Ok(());
        }
        let dev = cuda_dev(q.device())?;
        let (nkv, hd) = (plan.num_kv_heads, self.head_dim);
        let f = &k.cache(self.cache).decode2.iter().find(|(p, _)| *p == hp).expect("compiled head dims").1;
        // Partials: [parts][kv heads][16 rows] x (hd outputs, log2-sum-exp).
        let rows = plan.num_decode_parts.max(1) * nkv * DECODE_ROWS;
        let (part_o, part_lse) = if plan.num_decode_parts > 0 {
            (empty(dev, rows * hd, DType::F32)?, empty(dev, rows, DType::F32)?)
        } else {
            (empty(dev, 1, DType::F32)?, empty(dev, 1, DType::F32)?)
        };
        let cfg = LaunchConfig {
            // KV head fastest (attention.cu): neighbouring CTAs share blocks.
            grid_dim: ((plan.num_decode_items * nkv) as u32, 1, 1),
            block_dim: (decode2_threads(hp), 1, 1),
            shared_mem_bytes: decode2_smem_bytes(hp, self.cache != CacheFormat::Bf16) as u32,
        };
        let mut ptrs = self.pointers(q, plan, &plan.decode_items, out, (&part_o, &part_lse))?;
        ptrs.push(ptr(&plan.counters)?);
        let (ints, floats) = self.scalars(plan);
        launch_slices(f, cfg, &ptrs, &ints, &floats)
    }

    /// The attention kernels' pointer arguments, in their order: q, the
    /// layer, block tables, sequences, work items, output, split partials.
    fn pointers(&self, q: &Tensor, plan: &AttentionPlan, items: &Tensor, out: &Tensor, parts: (&Tensor, &Tensor)) -> Result<Vec<u64>> {
        Ok(vec![ptr(q)?, self.layer_ptr, ptr(&plan.tables)?, ptr(&plan.seqs)?, ptr(items)?, ptr(out)?, ptr(parts.0)?, ptr(parts.1)?])
    }

    /// Their scalars: (heads, KV heads, head dim, block size), then the
    /// softmax scale and the cache format's scales.
    fn scalars(&self, plan: &AttentionPlan) -> ([i32; 4], Vec<f32>) {
        let ints = [plan.num_heads as i32, plan.num_kv_heads as i32, self.head_dim as i32, self.block_size as i32];
        (ints, [vec![self.scale], self.cache.scale_args()].concat())
    }
}
