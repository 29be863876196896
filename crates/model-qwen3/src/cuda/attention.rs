//! Paged attention on the GPU: the host plans work items over the batch
//! (query tiles, and KV-length splits for decodes when the batch alone
//! would not fill the GPU), one kernel attends, a second merges splits.

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{bail, DType, Device, Result, Tensor};

use super::cudnn_attention::{CudnnPlan, PrefillContext, MIN_CUDNN_ROWS};
use super::{cuda_dev, empty, launch, overwrite_u32, ptr, upload_u32, Kernels};
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
    num_items: usize,
    num_decode_items: usize,
    num_combine: usize,
    num_parts: usize,
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
                CudnnPlan::new(ctx, &seqs, num_heads, num_kv_heads, device)?
            }
            None => None,
        };
        let kvc_takes = |s: &SeqChunk| cudnn.is_none() || !on_cudnn(s);
        let tok_per_tile = BR / group;
        let mut seqs = Vec::with_capacity(batch.seqs.len() * 4);
        let mut tables = Vec::new();
        for s in &batch.seqs {
            seqs.extend([s.start as u32, s.len as u32, s.context_len as u32, tables.len() as u32]);
            tables.extend(s.block_table.iter().copied());
        }
        let tiles: usize = batch.seqs.iter().filter(|s| kvc_takes(s)).map(|s| s.len.div_ceil(tok_per_tile)).sum();
        let base_ctas = tiles * num_kv_heads;
        let (mut items, mut decode_items, mut combine) = (Vec::new(), Vec::new(), Vec::new());
        let mut parts = 0u32;
        for (si, s) in batch.seqs.iter().enumerate().filter(|(_, s)| kvc_takes(s)) {
            let ctx = s.context_len;
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
                    let dst = if n * group <= DECODE_ROWS { &mut decode_items } else { &mut items };
                    dst.extend([si as u32, off as u32, n as u32, 0, ctx as u32, u32::MAX, 0]);
                    off += n;
                }
            }
        }
        Ok(Self {
            num_items: items.len() / 7,
            num_decode_items: decode_items.len() / 7,
            decode_items: upload_u32(decode_items, device)?,
            num_combine: combine.len() / 4,
            num_parts: parts as usize,
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
}

/// Whether a decode of this model can run with a fixed plan: one token per
/// sequence must fit one decode work item.
pub(crate) fn fixed_plan_fits(num_heads: usize, num_kv_heads: usize) -> bool {
    num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_heads / num_kv_heads <= DECODE_ROWS
}

/// KV splits per sequence for a graph of `batch` decodes: about
/// [`TARGET_CTAS`] work items over the KV heads, at most 64.
pub(crate) fn fixed_splits(batch: usize, num_kv_heads: usize) -> usize {
    TARGET_CTAS.div_ceil(batch * num_kv_heads).clamp(1, 64)
}

impl FixedPlanHost {
    /// `batch`: decodes only (one token each, sequence i at row i).
    pub fn new(batch: &BatchInput, splits: usize) -> Result<Self> {
        let n = batch.seqs.len();
        let mut seqs = Vec::with_capacity(n * 4);
        let mut tables = Vec::new();
        let mut decode_items = Vec::with_capacity(n * splits * 7);
        let mut combine = Vec::with_capacity(n * 4);
        for (si, s) in batch.seqs.iter().enumerate() {
            if s.len != 1 || s.start != si {
                bail!("fixed attention plan: sequence {si} is not a decode at row {si}");
            }
            seqs.extend([si as u32, 1, s.context_len as u32, tables.len() as u32]);
            tables.extend_from_slice(s.block_table);
            let ctx = s.context_len;
            let split_len = ctx.div_ceil(splits).div_ceil(BC) * BC;
            combine.extend([si as u32, (si * splits) as u32, splits as u32, 1]);
            for p in 0..splits {
                let (b, e) = ((p * split_len).min(ctx), ((p + 1) * split_len).min(ctx));
                decode_items.extend([si as u32, 0, 1, b as u32, e as u32, (si * splits + p) as u32, 0]);
            }
        }
        Ok(Self { seqs, tables, decode_items, combine })
    }

    /// Table entries of the batch.
    pub fn table_len(&self) -> usize {
        self.tables.len()
    }

    /// The device plan, allocated (at capture), with room for
    /// `table_capacity` table entries.
    pub fn upload(&self, num_heads: usize, num_kv_heads: usize, table_capacity: usize, device: &Device) -> Result<AttentionPlan> {
        let n = self.seqs.len() / 4;
        let mut tables = self.tables.clone();
        tables.resize(table_capacity.max(tables.len()), 0);
        Ok(AttentionPlan {
            seqs: upload_u32(self.seqs.clone(), device)?,
            tables: upload_u32(tables, device)?,
            items: upload_u32(Vec::new(), device)?,
            decode_items: upload_u32(self.decode_items.clone(), device)?,
            combine: upload_u32(self.combine.clone(), device)?,
            num_items: 0,
            num_decode_items: self.decode_items.len() / 7,
            num_combine: n,
            num_parts: self.decode_items.len() / 7,
            num_heads,
            num_kv_heads,
            cudnn: None,
        })
    }

    /// Copies into a plan made by [`Self::upload`] for the same batch size
    /// and splits, with room for these tables (before a replay).
    pub fn write_into(&self, plan: &AttentionPlan) -> Result<()> {
        overwrite_u32(&plan.seqs, &self.seqs)?;
        overwrite_u32(&plan.tables, &self.tables)?;
        overwrite_u32(&plan.decode_items, &self.decode_items)?;
        overwrite_u32(&plan.combine, &self.combine)
    }
}

pub struct PagedAttention {
    /// Device address of the layer's first block.
    pub layer_ptr: u64,
    pub block_size: usize,
    pub head_dim: usize,
    pub scale: f32,
}

impl PagedAttention {
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
        let f = &k.attention.iter().find(|(p, _)| *p == hp).expect("compiled head dims").1;
        let fd = &k.decode.iter().find(|(p, _)| *p == hp).expect("compiled head dims").1;
        let out = empty(dev, (t, nh * hd), DType::BF16)?;
        // cuDNN first: kvc's kernels then write their rows after it.
        if let Some(c) = &plan.cudnn {
            c.run(k, q, &out, self.layer_ptr, nkv, hd, self.block_size)?;
        }
        let parts = plan.num_parts.max(1) * nkv * BR;
        let part_o = if plan.num_parts > 0 { empty(dev, parts * hd, DType::F32)? } else { empty(dev, 1, DType::F32)? };
        let part_lse = if plan.num_parts > 0 { empty(dev, parts, DType::F32)? } else { empty(dev, 1, DType::F32)? };
        for (func, items, n, smem) in
            [(f, &plan.items, plan.num_items, smem_bytes(hp)), (fd, &plan.decode_items, plan.num_decode_items, decode_smem_bytes(hp))]
        {
            if n == 0 {
                continue;
            }
            let cfg = LaunchConfig { grid_dim: (n as u32, nkv as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
            launch!(
                func,
                cfg,
                ptr(q)?,
                self.layer_ptr,
                ptr(&plan.tables)?,
                ptr(&plan.seqs)?,
                ptr(items)?,
                ptr(&out)?,
                ptr(&part_o)?,
                ptr(&part_lse)?,
                nh as i32,
                nkv as i32,
                hd as i32,
                self.block_size as i32,
                self.scale
            )?;
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
}
