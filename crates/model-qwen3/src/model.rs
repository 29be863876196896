//! Qwen3 / Qwen3-MoE causal LM over the paged KV pool.

use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, RmsNorm, VarBuilder};
use kvc_kv_pool::{KvLayout, KvStorage};

use crate::attention::Attention;
use crate::batch::BatchInput;
use crate::config::Qwen3Config;
use crate::mlp::FeedForward;
use crate::rope::Rope;
use crate::{weights, ModelError};

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

pub struct Qwen3Model {
    config: Qwen3Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Tensor,
    rope: Rope,
    device: Device,
    dtype: DType,
    /// The checkpoint's FP8 KV cache scales per layer (kv_scales.rs).
    kv_scales: Option<Vec<(f32, f32)>>,
    /// The decoder layers in bf16 with kvc's kernels, when on a GPU
    /// (`layers` is then empty).
    #[cfg(feature = "cuda")]
    gpu: Option<crate::cuda::GpuModel>,
    /// Decode steps as CUDA graphs ([`Self::set_cuda_graphs`]); None: off.
    #[cfg(feature = "cuda")]
    graphs: std::sync::Mutex<Option<crate::cuda::DecodeGraphs>>,
}

/// The dtype named by a config or flag ("float32", "bf16", ...).
pub fn parse_dtype(s: &str) -> Result<DType, ModelError> {
    match s.to_ascii_lowercase().as_str() {
        "float32" | "f32" | "float" => Ok(DType::F32),
        "bfloat16" | "bf16" => Ok(DType::BF16),
        "float16" | "f16" | "half" => Ok(DType::F16),
        other => Err(ModelError::Config(format!("unsupported dtype {other:?} (float32, bfloat16, float16)"))),
    }
}

impl Qwen3Model {
    pub fn new(config: Qwen3Config, vb: VarBuilder) -> Result<Self, ModelError> {
        let device = vb.device().clone();
        let dtype = vb.dtype();
        let m = vb.pp("model");
        let embed_tokens = candle_nn::embedding(config.vocab_size, config.hidden_size, m.pp("embed_tokens"))?;
        #[cfg(feature = "cuda")]
        let gpu = if device.is_cuda() { Some(crate::cuda::GpuModel::new(&config, &vb)?) } else { None };
        #[cfg(feature = "cuda")]
        let cpu_layers = if gpu.is_some() { 0 } else { config.num_hidden_layers };
        #[cfg(not(feature = "cuda"))]
        let cpu_layers = config.num_hidden_layers;
        let mut layers = Vec::with_capacity(cpu_layers);
        for l in 0..cpu_layers {
            let lv = m.pp("layers").pp(l.to_string());
            layers.push(DecoderLayer {
                input_layernorm: candle_nn::rms_norm(config.hidden_size, config.rms_norm_eps, lv.pp("input_layernorm"))?,
                self_attn: Attention::new(&config, lv.pp("self_attn"))?,
                post_attention_layernorm: candle_nn::rms_norm(config.hidden_size, config.rms_norm_eps, lv.pp("post_attention_layernorm"))?,
                mlp: FeedForward::new(&config, l, lv.pp("mlp"))?,
            });
        }
        let norm = candle_nn::rms_norm(config.hidden_size, config.rms_norm_eps, m.pp("norm"))?;
        let lm_head = if config.tie_word_embeddings {
            embed_tokens.embeddings().clone()
        } else {
            vb.pp("lm_head").get((config.vocab_size, config.hidden_size), "weight")?
        };
        let rope = Rope::new(config.head_dim, config.rope_theta, &config.rope_scaling);
        Ok(Self {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            device,
            dtype,
            kv_scales: None,
            #[cfg(feature = "cuda")]
            gpu,
            #[cfg(feature = "cuda")]
            graphs: std::sync::Mutex::new(None),
        })
    }

    /// Loads `config.json` and safetensors from a directory. `dtype` None
    /// means the checkpoint's own dtype.
    pub fn load(dir: &Path, dtype: Option<DType>, device: &Device) -> Result<Self, ModelError> {
        let config = Qwen3Config::from_json(&read_config(dir)?)?;
        let dtype = match dtype {
            Some(d) => d,
            None => config.dtype.as_deref().map(parse_dtype).transpose()?.unwrap_or(DType::F32),
        };
        Self::load_observed(dir, dtype, device, None, Box::new(|_| {}))
    }

    /// As [`Qwen3Model::load`] in `dtype`, reporting each tensor's bytes
    /// to `on_tensor` as it is read. A checkpoint with tensors the model
    /// does not read, or in dtypes it does not load, is refused by name.
    ///
    /// `quantize` (`--quantization fp8`, in [`crate::fp8::AT_LOAD`]'s
    /// blocks): a plain checkpoint's projections are quantized to block FP8
    /// as they are read, so the model is the block-FP8 checkpoint that
    /// quantizing it would make (FP8 GEMMs on the GPU, the quantized values
    /// on the CPU); a checkpoint already in block FP8 keeps its own scales.
    pub fn load_observed(
        dir: &Path,
        dtype: DType,
        device: &Device,
        quantize: Option<crate::fp8::BlockFp8>,
        on_tensor: weights::OnTensor,
    ) -> Result<Self, ModelError> {
        let mut config = Qwen3Config::from_json(&read_config(dir)?)?;
        let stored = config.fp8;
        let at_load = match (quantize, stored) {
            (Some(q), None) => {
                tracing::info!(block = ?q.block, "--quantization fp8: the checkpoint's projections are quantized to block FP8 as they load");
                config.fp8 = Some(q);
                Some(q)
            }
            (Some(_), Some(own)) => {
                tracing::info!(block = ?own.block, "--quantization fp8: the checkpoint is block FP8 already; its own weights and scales are used");
                None
            }
            (None, _) => None,
        };
        if let Some(fp8) = config.fp8 {
            #[cfg(feature = "cuda")]
            let why = if !device.is_cuda() {
                Some("the CPU path dequantizes them")
            } else if !crate::cuda::fp8_weights() {
                Some("the kernel plan dequantizes them (KVC_FP8_GEMM=dequantize, or the FP8 GEMMs do not run here)")
            } else {
                None
            };
            #[cfg(not(feature = "cuda"))]
            let why = Some("the CPU path dequantizes them");
            if let Some(why) = why {
                tracing::warn!(
                    block = ?fp8.block,
                    ?dtype,
                    "block-FP8 weights (the checkpoint's, or quantized at load): dequantized at load to the compute dtype \
                     ({why}), so they take that dtype's memory"
                );
            }
        }
        let checkpoint = weights::Checkpoint::open(dir, dtype, device, stored, at_load, on_tensor)?;
        let tied = config.tie_word_embeddings;
        let layers = config.num_hidden_layers;
        let mut model = Self::new(config, checkpoint.vb.clone())?;
        model.kv_scales = crate::kv_scales::read(&checkpoint.vb, layers)?;
        // Rotary tables some exporters save (recomputed here), and a tied
        // model's copy of the embeddings as its head.
        checkpoint.check_all_read(|n| n.ends_with(".rotary_emb.inv_freq") || (tied && n == "lm_head.weight"))?;
        Ok(model)
    }

    /// Random weights for `config` (deterministic in `seed`); with a
    /// block-FP8 `config.fp8`, the GPU path's FP8 projections are those
    /// weights quantized on the device.
    pub fn dummy(config: Qwen3Config, seed: u64, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        let vb = weights::dummy_var_builder(seed, dtype, device, config.fp8);
        Self::new(config, vb)
    }

    /// The (K, V) scales per layer an FP8 KV cache stores K and V over,
    /// as the checkpoint gives them (kv_scales.rs); None: it gives none.
    pub fn kv_scales(&self) -> Option<&[(f32, f32)]> {
        self.kv_scales.as_deref()
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The KV layout this model needs.
    pub fn kv_layout(&self, block_size: usize) -> KvLayout {
        KvLayout {
            num_layers: self.config.num_hidden_layers,
            num_kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim,
            block_size,
            dtype: self.dtype,
        }
    }

    /// Runs decode steps of up to `max_batch` sequences as CUDA graphs, one
    /// per batch size, captured at first use (0: never). Only on a CUDA
    /// device; elsewhere this does nothing. vLLM's default with
    /// `--enforce-eager` off.
    #[cfg(feature = "cuda")]
    pub fn set_cuda_graphs(&self, max_batch: usize) {
        let on = max_batch > 0 && self.gpu.is_some();
        *self.graphs.lock().unwrap_or_else(|e| e.into_inner()) = on.then(|| crate::cuda::DecodeGraphs::new(max_batch));
    }

    /// Prepares prefill attention for chunks of up to `max_tokens` tokens
    /// (cuDNN's graphs, built at load instead of at a request's first
    /// chunk). Only on a CUDA device; elsewhere this does nothing.
    #[cfg(feature = "cuda")]
    pub fn warm_up_attention(&self, max_tokens: usize) {
        if let Some(gpu) = &self.gpu {
            gpu.warm_up_attention(max_tokens);
        }
    }

    /// The device bytes of the weights of a model on a CUDA device (None
    /// elsewhere): the decoder layers' projections (FP8 or bf16) by count,
    /// and everything including embeddings and LM head.
    #[cfg(feature = "cuda")]
    pub fn gpu_weight_bytes(&self) -> Option<crate::cuda::WeightBytes> {
        let gpu = self.gpu.as_ref()?;
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let mut w = gpu.weight_bytes();
        w.total += bytes(self.embed_tokens.embeddings());
        if !self.config.tie_word_embeddings {
            w.total += bytes(&self.lm_head);
        }
        Some(w)
    }

    /// Why CUDA graphs were turned off after a failed capture, if they were.
    #[cfg(feature = "cuda")]
    pub fn cuda_graphs_disabled(&self) -> Option<String> {
        self.graphs.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|g| g.disabled().map(str::to_string))
    }

    /// The forward pass of `batch` captured as a CUDA graph, replayable
    /// ([`crate::cuda::CapturedStep`]); the model must be on a CUDA device.
    #[cfg(feature = "cuda")]
    pub fn capture_step(&self, batch: &BatchInput, kv: &KvStorage) -> Result<crate::cuda::CapturedStep, ModelError> {
        check_batch(batch, kv, self.config.vocab_size)?;
        let Some(gpu) = &self.gpu else { return Err(ModelError::Input("CUDA graphs need the model on a CUDA device".into())) };
        Ok(gpu.capture(&self.embed_tokens, &self.lm_head, batch, kv)?)
    }

    /// Runs a flattened batch; writes its K/V into `kv`; returns f32 logits
    /// `[batch.logits_rows.len(), vocab]`.
    pub fn forward(&self, batch: &BatchInput, kv: &mut KvStorage) -> Result<Tensor, ModelError> {
        check_batch(batch, kv, self.config.vocab_size)?;
        #[cfg(feature = "cuda")]
        if let Some(gpu) = &self.gpu {
            let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(g) = graphs.as_mut().filter(|g| g.takes(gpu, batch)) {
                match g.forward(gpu, &self.embed_tokens, &self.lm_head, batch, kv) {
                    Ok(logits) => return Ok(logits),
                    // The eager pass below runs this step instead.
                    Err(e) => {
                        tracing::warn!(error = %e, "CUDA graph capture or replay failed; decode steps run eagerly from now on");
                        g.disable(format!("CUDA graph capture or replay failed: {e}"));
                    }
                }
            }
            return Ok(gpu.forward(&self.embed_tokens, &self.lm_head, batch, kv)?);
        }
        self.project_logits(&self.cpu_hidden(batch, kv)?)
    }

    /// The forward pass of [`Self::forward`] without the LM head: the final
    /// (normed) hidden states of `batch.logits_rows`, `[rows, hidden]`. A
    /// caller that needs many rows' logits (prompt logprobs) projects them
    /// a slice at a time ([`Self::project_logits`]), so that no
    /// `[rows, vocab]` tensor of a whole prefill chunk is ever built.
    pub fn forward_hidden(&self, batch: &BatchInput, kv: &mut KvStorage) -> Result<Tensor, ModelError> {
        check_batch(batch, kv, self.config.vocab_size)?;
        #[cfg(feature = "cuda")]
        if let Some(gpu) = &self.gpu {
            return Ok(gpu.forward_hidden(&self.embed_tokens, batch, kv)?);
        }
        self.cpu_hidden(batch, kv)
    }

    /// f32 logits `[rows, vocab]` of final hidden states `[rows, hidden]`
    /// (what [`Self::forward_hidden`] returns, or a slice of it).
    pub fn project_logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        Ok(crate::row_invariant::matmul_rows(hidden, &self.lm_head.t()?)?.to_dtype(DType::F32)?)
    }

    fn cpu_hidden(&self, batch: &BatchInput, kv: &mut KvStorage) -> Result<Tensor, ModelError> {
        let t = batch.tokens.len();
        let bs = kv.layout().block_size;
        let positions = batch.positions();
        let slots = batch.slots(bs);
        let cos_sin = self.rope.cos_sin(&positions, &self.device)?;
        let ids = Tensor::from_vec(batch.tokens.clone(), t, &self.device)?;
        let mut x = self.embed_tokens.forward(&ids)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let h = layer.input_layernorm.forward(&x)?;
            let h = layer.self_attn.forward(&h, batch, &slots, &cos_sin, kv, l)?;
            x = (x + h)?;
            let h = layer.mlp.forward(&layer.post_attention_layernorm.forward(&x)?)?;
            x = (x + h)?;
        }
        let rows =
            Tensor::from_vec(batch.logits_rows.iter().map(|&r| r as u32).collect::<Vec<_>>(), batch.logits_rows.len(), &self.device)?;
        Ok(self.norm.forward(&x.index_select(&rows, 0)?)?)
    }
}

fn check_batch(batch: &BatchInput, kv: &KvStorage, vocab: usize) -> Result<(), ModelError> {
    let t = batch.tokens.len();
    if t == 0 || batch.logits_rows.is_empty() {
        return Err(ModelError::Input("empty batch".into()));
    }
    if let Some(&tok) = batch.tokens.iter().find(|&&tok| tok as usize >= vocab) {
        return Err(ModelError::Input(format!("token id {tok} is outside the vocabulary of {vocab}")));
    }
    if let Some(&r) = batch.logits_rows.iter().find(|&&r| r >= t) {
        return Err(ModelError::Input(format!("logits row {r} is outside the batch of {t} tokens")));
    }
    let bs = kv.layout().block_size;
    for s in &batch.seqs {
        if s.len == 0 || s.context_len < s.len || s.start + s.len > t || s.block_table.len() * bs < s.context_len {
            return Err(ModelError::Input(format!("inconsistent sequence chunk {s:?}")));
        }
    }
    Ok(())
}

pub fn read_config(dir: &Path) -> Result<String, ModelError> {
    let p = dir.join("config.json");
    std::fs::read_to_string(&p).map_err(|e| ModelError::Config(format!("{}: {e}", p.display())))
}
