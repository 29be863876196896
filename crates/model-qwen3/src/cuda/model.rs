//! Decoder layers on the GPU in bf16: fused QKV GEMM, one kernel for q/k
//! RMSNorm + RoPE + the paged K/V write, paged attention, residual adds
//! fused into the next RMSNorm, and the dense or MoE feed-forward. A
//! block-FP8 checkpoint's projections stay FP8 where the FP8 GEMMs run
//! (fp8_linear.rs).

use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_nn::{Embedding, VarBuilder};
use kvc_kv_pool::KvStorage;

use super::attention::FixedPlanHost;
use super::fp8_linear::{ExpertWeights, GpuLinear, ProjectionLoader, WeightBytes};
use super::layers::{add_rmsnorm, moe_sum_add_rmsnorm, silu_mul, Form, RopeStore};
use super::moe::{Fp8Moe, GpuMoe};
use super::{
    cuda_dev, empty, gather_rows, launch, overwrite_u32, ptr, upload_u32, AttentionPlan, CacheFormat, CudnnAttention, Kernels,
    PagedAttention, PrefillBackend, PrefillContext,
};
use crate::batch::BatchInput;
use crate::config::Qwen3Config;
use std::sync::Arc;

/// A batch's inputs on the device, as [`GpuModel::run`] reads them.
pub struct StepInputs {
    tokens: usize,
    pos: Tensor,
    slots: Tensor,
    plan: AttentionPlan,
    ids: Tensor,
    rows: Tensor,
}

/// A batch's per-token inputs on the host: token ids, positions, KV slots.
struct TokenInputs {
    ids: Vec<u32>,
    pos: Vec<u32>,
    slots: Vec<u32>,
}

impl TokenInputs {
    fn new(batch: &BatchInput, block_size: usize) -> Self {
        Self { ids: batch.tokens.clone(), pos: batch.positions(), slots: batch.slots(block_size).into_iter().map(|s| s as u32).collect() }
    }
}

/// A decode batch's inputs on the host, in the fixed shapes of a CUDA graph
/// for its batch size ([`FixedPlanHost`]).
pub(crate) struct GraphInputsHost {
    tokens: TokenInputs,
    plan: FixedPlanHost,
}

impl GraphInputsHost {
    pub fn new(batch: &BatchInput, block_size: usize, splits: usize) -> Result<Self> {
        Ok(Self { tokens: TokenInputs::new(batch, block_size), plan: FixedPlanHost::new(batch, splits)? })
    }

    /// `batch`'s decodes followed by `rows - n` padding decodes (a graph
    /// captured for a larger batch): each of one token at position 0 with
    /// a context of itself in `pad_block`, its K/V not stored (slot -1).
    /// Their rows are computed and dropped.
    pub fn padded(batch: &BatchInput, block_size: usize, splits: usize, rows: usize, pad_block: &[kvc_kv_pool::BlockId]) -> Result<Self> {
        let n = batch.seqs.len();
        if rows <= n {
            return Self::new(batch, block_size, splits);
        }
        let mut seqs = batch.seqs.clone();
        seqs.extend((n..rows).map(|i| crate::batch::SeqChunk { start: i, len: 1, context_len: 1, block_table: pad_block }));
        let mut tokens = batch.tokens.clone();
        tokens.resize(rows, 0);
        let padded = BatchInput { tokens, seqs, logits_rows: (0..rows).collect() };
        let mut host = Self::new(&padded, block_size, splits)?;
        for s in &mut host.tokens.slots[n..] {
            *s = u32::MAX;
        }
        Ok(host)
    }

    /// Block-table entries of the batch.
    pub fn table_len(&self) -> usize {
        self.plan.table_len()
    }
}

impl StepInputs {
    fn upload(tokens: &TokenInputs, plan: AttentionPlan, rows: Vec<u32>, device: &Device) -> Result<Self> {
        Ok(Self {
            tokens: tokens.ids.len(),
            pos: upload_u32(tokens.pos.clone(), device)?,
            slots: upload_u32(tokens.slots.clone(), device)?,
            plan,
            ids: upload_u32(tokens.ids.clone(), device)?,
            rows: upload_u32(rows, device)?,
        })
    }

    /// Device copies of `host` (at capture), with room for `table_capacity`
    /// block-table entries: logits for every row.
    pub(crate) fn from_graph_host(
        host: &GraphInputsHost,
        num_heads: usize,
        num_kv_heads: usize,
        table_capacity: usize,
        device: &Device,
    ) -> Result<Self> {
        let plan = host.plan.upload(num_heads, num_kv_heads, table_capacity, device)?;
        Self::upload(&host.tokens, plan, (0..host.tokens.ids.len() as u32).collect(), device)
    }

    /// Rewrites these inputs (made by [`Self::from_graph_host`] for the same
    /// batch size) with the next step's, before a replay.
    pub(crate) fn write(&self, host: &GraphInputsHost) -> Result<()> {
        overwrite_u32(&self.ids, &host.tokens.ids)?;
        overwrite_u32(&self.pos, &host.tokens.pos)?;
        overwrite_u32(&self.slots, &host.tokens.slots)?;
        host.plan.write_into(&self.plan)
    }
}

enum Ffn {
    /// `gate_up [2I, H]`, `down [H, I]`.
    Dense {
        gate_up: GpuLinear,
        down: GpuLinear,
    },
    Moe(GpuMoe),
    Fp8Moe(Fp8Moe),
}

struct Layer {
    input_norm: Tensor,
    post_norm: Tensor,
    /// `[(nh + 2 nkv) * hd, H]`
    qkv: GpuLinear,
    qkv_bias: Option<Tensor>,
    o_proj: GpuLinear,
    o_bias: Option<Tensor>,
    q_norm: Tensor,
    k_norm: Tensor,
    /// Bounds every element of the layer's queries (FP8 attention's Q scale).
    q_absmax: f32,
    ffn: Ffn,
}

pub(crate) struct GpuModel {
    kernels: Kernels,
    /// Prefill-shaped attention on cuDNN (cudnn_attention.rs); None: kvc's kernels.
    cudnn: Option<Arc<CudnnAttention>>,
    layers: Vec<Layer>,
    final_norm: Tensor,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    eps: f32,
    /// RoPE's frequencies `[hd / 2]` f32 (default, linear or YaRN: rope.rs).
    inv_freq: Tensor,
    /// cos and sin are multiplied by it (YaRN's attention factor; else 1).
    rope_scale: f32,
}

impl GpuModel {
    pub fn new(cfg: &Qwen3Config, vb: &VarBuilder) -> Result<Self> {
        if vb.dtype() != DType::BF16 {
            bail!("the CUDA path runs in bf16 (got {:?}); pass --dtype bf16", vb.dtype());
        }
        // The frequencies as the CPU path computes them (transformers'
        // formulas, scaled RoPE included); the kernel takes the table.
        let rope = crate::rope::Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling);
        let inv_freq = Tensor::from_slice(rope.inv_freq(), cfg.head_dim / 2, vb.device())?;
        let kernels = Kernels::load(cuda_dev(vb.device())?)?;
        let cudnn = CudnnAttention::open(PrefillBackend::current(), vb.device());
        let (h, nh, nkv, hd) = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let m = vb.pp("model");
        let mut proj = ProjectionLoader::new(cfg.fp8);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let lv = m.pp("layers").pp(l.to_string());
            let a = lv.pp("self_attn");
            let qkv = [(a.pp("q_proj"), nh * hd), (a.pp("k_proj"), nkv * hd), (a.pp("v_proj"), nkv * hd)];
            let qkv = proj.linear(&format!("layers.{l}.self_attn.qkv"), &qkv, h)?;
            let o_proj = proj.linear(&format!("layers.{l}.self_attn.o_proj"), &[(a.pp("o_proj"), h)], nh * hd)?;
            let (qkv_bias, o_bias) = if cfg.attention_bias {
                let b = |name: &str, n: usize| a.pp(name).get(n, "bias");
                (Some(Tensor::cat(&[b("q_proj", nh * hd)?, b("k_proj", nkv * hd)?, b("v_proj", nkv * hd)?], 0)?), Some(b("o_proj", h)?))
            } else {
                (None, None)
            };
            let mv = lv.pp("mlp");
            let ffn = match &cfg.moe {
                Some(moe) if cfg.is_moe_layer(l) => {
                    let (e, i) = (moe.num_experts, moe.moe_intermediate_size);
                    let router = mv.pp("gate").get((e, h), "weight")?;
                    let (top_k, norm_topk_prob) = (moe.num_experts_per_tok, moe.norm_topk_prob);
                    match proj.experts(&format!("layers.{l}.mlp.experts"), &mv.pp("experts"), e, i, h)? {
                        ExpertWeights::Bf16(gate_up, down) => {
                            Ffn::Moe(GpuMoe { router, gate_up, down, num_experts: e, intermediate: i, top_k, norm_topk_prob })
                        }
                        ExpertWeights::Fp8(gate_up, down) => {
                            Ffn::Fp8Moe(Fp8Moe { router, gate_up, down, num_experts: e, intermediate: i, top_k, norm_topk_prob })
                        }
                    }
                }
                _ => {
                    let i = cfg.intermediate_size;
                    let gate_up = proj.linear(&format!("layers.{l}.mlp.gate_up"), &[(mv.pp("gate_proj"), i), (mv.pp("up_proj"), i)], h)?;
                    Ffn::Dense { gate_up, down: proj.linear(&format!("layers.{l}.mlp.down_proj"), &[(mv.pp("down_proj"), h)], i)? }
                }
            };
            let q_norm = a.pp("q_norm").get(hd, "weight")?;
            let q_norm_absmax = q_norm.abs()?.max(0)?.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            layers.push(Layer {
                input_norm: lv.pp("input_layernorm").get(h, "weight")?,
                post_norm: lv.pp("post_attention_layernorm").get(h, "weight")?,
                qkv,
                qkv_bias,
                o_proj,
                o_bias,
                q_absmax: super::q_absmax(hd, q_norm_absmax, rope.scale()),
                q_norm,
                k_norm: a.pp("k_norm").get(hd, "weight")?,
                ffn,
            });
        }
        proj.finish();
        Ok(Self {
            kernels,
            cudnn,
            layers,
            final_norm: m.pp("norm").get(h, "weight")?,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            eps: cfg.rms_norm_eps as f32,
            inv_freq,
            rope_scale: rope.scale(),
        })
    }

    fn rmsnorm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let (t, h) = x.dims2()?;
        let out = empty(cuda_dev(x.device())?, (t, h), DType::BF16)?;
        let cfg = LaunchConfig { grid_dim: (t as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        launch!(self.kernels.rmsnorm, cfg, ptr(x)?, ptr(w)?, ptr(&out)?, h as i32, self.eps)?;
        Ok(out)
    }

    /// `x += h` in place, then returns rmsnorm(x).
    fn add_rmsnorm(&self, x: &Tensor, h: &Tensor, w: &Tensor) -> Result<Tensor> {
        add_rmsnorm(&self.kernels, x, h, w, self.eps)
    }

    fn linear(&self, x: &Tensor, w: &GpuLinear, b: Option<&Tensor>) -> Result<Tensor> {
        let y = w.forward(&self.kernels, x)?;
        match b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// The device bytes of the decoder layers' weights (the embeddings and
    /// LM head are the caller's), by kind.
    pub fn weight_bytes(&self) -> WeightBytes {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let mut w = WeightBytes { total: bytes(&self.final_norm), ..Default::default() };
        let linear = |l: &GpuLinear, w: &mut WeightBytes| {
            w.projections += l.bytes();
            if l.is_fp8() {
                w.fp8_weights += 1;
            } else {
                w.bf16_weights += 1;
            }
        };
        for layer in &self.layers {
            linear(&layer.qkv, &mut w);
            linear(&layer.o_proj, &mut w);
            w.total += [&layer.input_norm, &layer.post_norm, &layer.q_norm, &layer.k_norm].iter().map(|t| bytes(t)).sum::<usize>();
            w.total += layer.qkv_bias.iter().chain(&layer.o_bias).map(bytes).sum::<usize>();
            match &layer.ffn {
                Ffn::Dense { gate_up, down } => {
                    linear(gate_up, &mut w);
                    linear(down, &mut w);
                }
                Ffn::Moe(m) => {
                    w.projections += bytes(&m.gate_up) + bytes(&m.down);
                    w.bf16_weights += 2;
                    w.total += bytes(&m.router);
                }
                Ffn::Fp8Moe(m) => {
                    w.projections += m.gate_up.bytes() + m.down.bytes();
                    w.fp8_weights += 2;
                    w.total += bytes(&m.router);
                }
            }
        }
        w.total += w.projections;
        w
    }

    /// See `Qwen3Model::warm_up_attention`.
    pub fn warm_up_attention(&self, max_tokens: usize) {
        if let Some(c) = &self.cudnn {
            c.warm_up(self.num_heads, self.num_kv_heads, self.head_dim, max_tokens);
        }
    }

    pub fn heads(&self) -> (usize, usize) {
        (self.num_heads, self.num_kv_heads)
    }

    /// The CUDA forward pass; same contract as `Qwen3Model::forward`.
    pub fn forward(&self, embed: &Embedding, lm_head: &Tensor, batch: &BatchInput, kv: &KvStorage) -> Result<Tensor> {
        let inputs = self.prepare(embed, batch, kv)?;
        self.run(embed, lm_head, &inputs, kv, false)
    }

    /// The eager pass without the LM head; same contract as
    /// `Qwen3Model::forward_hidden` (bf16 `[rows, hidden]`).
    pub fn forward_hidden(&self, embed: &Embedding, batch: &BatchInput, kv: &KvStorage) -> Result<Tensor> {
        let inputs = self.prepare(embed, batch, kv)?;
        self.run_hidden(embed, &inputs, kv, false)
    }

    /// Copies a batch's inputs to the device: everything [`Self::run`]
    /// reads from the host side.
    pub fn prepare(&self, embed: &Embedding, batch: &BatchInput, kv: &KvStorage) -> Result<StepInputs> {
        let device = embed.embeddings().device();
        let prefill = self.cudnn.as_ref().map(|attention| PrefillContext {
            attention,
            fp8_cache: kv.layout().dtype == DType::F8E4M3,
            head_dim: self.head_dim,
            block_size: kv.layout().block_size,
            num_blocks: kv.num_blocks(),
        });
        let plan = AttentionPlan::with_prefill(batch, self.num_heads, self.num_kv_heads, prefill, device)?;
        let rows = batch.logits_rows.iter().map(|&r| r as u32).collect();
        StepInputs::upload(&TokenInputs::new(batch, kv.layout().block_size), plan, rows, device)
    }

    /// The forward pass over prepared inputs: kernel launches and
    /// stream-ordered allocations, no copy from the host (what a CUDA graph
    /// can capture).
    ///
    /// `capturing`: the pass is being captured as a CUDA graph, so no step
    /// may wait for the host either (the cuBLAS expert path reads its
    /// offsets back; kvc's kernels take its place then).
    pub fn run(&self, embed: &Embedding, lm_head: &Tensor, inputs: &StepInputs, kv: &KvStorage, capturing: bool) -> Result<Tensor> {
        self.run_hidden(embed, inputs, kv, capturing)?.matmul(&lm_head.t()?)?.to_dtype(DType::F32)
    }

    /// [`Self::run`] up to the LM head: the final hidden states of the
    /// logits rows.
    fn run_hidden(&self, embed: &Embedding, inputs: &StepInputs, kv: &KvStorage, capturing: bool) -> Result<Tensor> {
        let device = embed.embeddings().device().clone();
        let dev = cuda_dev(&device)?;
        let t = inputs.tokens;
        let layout = *kv.layout();
        let Some(cache) = kv.device_tensor() else { bail!("the CUDA model needs a KV pool on the device (KvStorage::new_on)") };
        if !matches!(cache.dtype(), DType::BF16 | DType::F8E4M3) || !cache.device().same_device(&device) {
            bail!("KV pool must be bf16 or fp8 (e4m3) on the model's device, not {:?} on {:?}", cache.dtype(), cache.device());
        }
        let cache_base = ptr(cache)?;
        let layer_bytes = (kv.num_blocks() * layout.layer_block_bytes()) as u64;
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let (pos, slots, plan) = (&inputs.pos, &inputs.slots, &inputs.plan);
        let x = gather_rows(&self.kernels, embed.embeddings(), &inputs.ids, 1, t)?;
        let mut h = self.rmsnorm(&x, &self.layers.first().map(|l| &l.input_norm).unwrap_or(&self.final_norm).clone())?;
        for (l, layer) in self.layers.iter().enumerate() {
            let qkv = self.linear(&h, &layer.qkv, layer.qkv_bias.as_ref())?;
            // A step wholly on cuDNN's FP8 attention: Q written in e4m3 by
            // RoPE, O kept e4m3 into o_proj.
            let e4m3 = plan.e4m3_io();
            let q = empty(dev, (t, nh * hd), if e4m3 { DType::U8 } else { DType::BF16 })?;
            let layer_ptr = cache_base + l as u64 * layer_bytes;
            let format = CacheFormat::of(kv, l)?;
            RopeStore {
                qkv: &qkv,
                q_norm: &layer.q_norm,
                k_norm: &layer.k_norm,
                pos,
                slots,
                q_out: &q,
                layer_ptr,
                cache: format,
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: layout.block_size,
                eps: self.eps,
                inv_freq: &self.inv_freq,
                attn_scale: self.rope_scale,
                q_e4m3: e4m3.then(|| 448.0 / layer.q_absmax),
            }
            .launch(&self.kernels, Form::Auto)?;
            let attn = PagedAttention {
                layer_ptr,
                cache: format,
                block_size: layout.block_size,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                q_absmax: Some(layer.q_absmax),
            };
            let o = if e4m3 {
                let o = layer.o_proj.forward_e4m3(&self.kernels, &attn.forward_fp8(&self.kernels, &q, plan)?)?;
                match &layer.o_bias {
                    Some(b) => o.broadcast_add(b)?,
                    None => o,
                }
            } else {
                self.linear(&attn.forward(&self.kernels, &q, plan)?, &layer.o_proj, layer.o_bias.as_ref())?
            };
            let hn = self.add_rmsnorm(&x, &o, &layer.post_norm)?;
            let next = self.layers.get(l + 1).map(|n| &n.input_norm).unwrap_or(&self.final_norm);
            // The MoE blocks' weighted sum joins the residual add and the
            // next norm in one launch.
            h = match &layer.ffn {
                Ffn::Dense { gate_up, down } => {
                    let act = silu_mul(&self.kernels, &self.linear(&hn, gate_up, None)?, Form::Auto)?;
                    self.add_rmsnorm(&x, &self.linear(&act, down, None)?, next)?
                }
                Ffn::Moe(moe) => {
                    moe_sum_add_rmsnorm(&self.kernels, &x, &moe.forward_rows(&self.kernels, &hn, !capturing)?, next, self.eps)?
                }
                Ffn::Fp8Moe(moe) => moe_sum_add_rmsnorm(&self.kernels, &x, &moe.forward_rows(&self.kernels, &hn)?, next, self.eps)?,
            };
        }
        gather_rows(&self.kernels, &h, &inputs.rows, 1, inputs.rows.dim(0)?)
    }
}
