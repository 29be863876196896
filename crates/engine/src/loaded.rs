//! Loads what the engine serves: the model (from the source that
//! kvc_model_loading's `model_source` resolved), tokenizer, chat template
//! and KV pool.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{DType, Device};
use kvc_kv_pool::{KvLayout, KvPool};
use kvc_model_loading::model_source::{self, HubSettings, LoadFormat, ResolvedSource};
use kvc_model_loading::progress::Progress;
use kvc_model_qwen3::{parse_dtype, Qwen3Config, Qwen3Model};

use crate::kv_cache_dtype::KvScales;
use crate::quantization::Quantization;
use crate::{EngineConfig, EngineError};
use kvc_text_front::chat_template::ChatTemplate;
use kvc_text_front::tokenizer::TextTokenizer;

pub(crate) struct Loaded {
    pub model: Qwen3Model,
    pub pool: KvPool,
    pub tokenizer: TextTokenizer,
    pub template: Option<ChatTemplate>,
    pub eos_token_ids: Vec<u32>,
    pub vocab_size: usize,
    pub served_name: String,
    pub identity: Identity,
}

/// Who answers (crate::fingerprint).
pub(crate) struct Identity {
    /// `system_fingerprint`: this build, model and device.
    pub fingerprint: String,
    /// What computes the KV: the weights alone (`weights_identity`).
    pub weights: String,
}

fn load_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Load(e.to_string())
}

/// Reads the checkpoint's weights with a progress bar (or log lines) and
/// a summary of the time and GB/s.
fn load_weights(dir: &Path, dtype: DType, device: &Device, quantization: Quantization) -> Result<Qwen3Model, EngineError> {
    let total = kvc_model_qwen3::weights::checkpoint_bytes(dir).map_err(load_err)?;
    let files = kvc_model_qwen3::weights::safetensors_files(dir).map_err(load_err)?.len();
    let item = format!("{files} safetensors file{}", if files == 1 { "" } else { "s" });
    let progress = Arc::new(Mutex::new(Some(Progress::start("load weights", item, total, 0))));
    let sink = progress.clone();
    let on_tensor = Box::new(move |bytes: u64| {
        if let Some(p) = sink.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            p.inc(bytes);
        }
    });
    let loaded = Qwen3Model::load_observed(dir, dtype, device, quantization.at_load(), on_tensor);
    let progress = progress.lock().unwrap_or_else(|e| e.into_inner()).take();
    match (loaded, progress) {
        (Ok(model), Some(p)) => {
            p.finish();
            Ok(model)
        }
        (loaded, p) => {
            p.map(Progress::abandon);
            loaded.map_err(load_err)
        }
    }
}

/// Compute dtype: the flag, else f32 on a CPU (candle's CPU half-precision
/// matmuls are slow) and bf16 on a GPU (the CUDA path's kernels are bf16).
fn compute_dtype(flag: Option<&str>, config: &Qwen3Config, device: &Device) -> Result<DType, EngineError> {
    if let Some(f) = flag.filter(|f| *f != "auto") {
        return parse_dtype(f).map_err(load_err);
    }
    // The checkpoint's dtype must still be one kvc reads.
    config.dtype.as_deref().map(parse_dtype).transpose().map_err(load_err)?;
    Ok(if device.is_cpu() { DType::F32 } else { DType::BF16 })
}

pub(crate) fn load(config: &EngineConfig) -> Result<Loaded, EngineError> {
    let device = crate::device::select(&config.device)?;
    crate::kernel_plan::apply(&config.kernels, &device)?;
    let hub = HubSettings { revision: config.revision.clone(), cache_dir: config.download_dir.clone() };
    let ResolvedSource { dir, served_default, config_json } = model_source::resolve(&config.model, config.load_format, hub)?;
    let mut model_config = Qwen3Config::from_json(&config_json).map_err(load_err)?;
    let dtype = compute_dtype(config.dtype.as_deref(), &model_config, &device)?;
    let real_weights = dir.is_some() && config.load_format == LoadFormat::Auto;
    let model = match (&dir, config.load_format) {
        (Some(d), LoadFormat::Auto) => load_weights(d, dtype, &device, config.quantization)?,
        _ => {
            // Dummy weights: the GPU path draws them and quantizes its
            // projections to block FP8, as it does for a block-FP8 config.
            if model_config.fp8.is_none() {
                model_config.fp8 = config.quantization.at_load();
            }
            Qwen3Model::dummy(model_config.clone(), config.seed, dtype, &device).map_err(load_err)?
        }
    };
    let mut weights = if real_weights { "checkpoint".to_string() } else { format!("dummy seed {}", config.seed) };
    if config.quantization != Quantization::None {
        weights += &format!(" quantization {:?}", config.quantization);
    }
    let weights = format!("{weights} dtype {dtype:?}");
    let checkpoint = dir.as_deref().map_or_else(|| "embedded".to_string(), crate::fingerprint::checkpoint_identity);
    let fingerprint = crate::fingerprint::system_fingerprint(&format!("{weights}\n{checkpoint}"), &format!("{device:?}"));
    let weights = crate::fingerprint::weights_identity(&weights, dir.as_deref());
    #[cfg(feature = "cuda")]
    if !config.enforce_eager {
        model.set_cuda_graphs(crate::config::CUDA_GRAPH_MAX_BATCH.min(config.max_num_seqs));
    }
    #[cfg(feature = "cuda")]
    model.warm_up_attention(config.max_num_batched_tokens);
    let mut tokenizer = match &dir {
        None => TextTokenizer::embedded_qwen3()?,
        Some(d) => TextTokenizer::from_dir(d)?,
    };
    if let Some(source) = &config.chat_template {
        tokenizer = tokenizer.with_chat_template(source.clone());
        tracing::info!(bytes = source.len(), "chat template: the --chat-template one replaces the model's");
    }
    let template = tokenizer.chat_template_source().map(ChatTemplate::new).transpose()?;
    let mut eos_token_ids = tokenizer.eos_token_ids();
    for id in &model_config.eos_token_ids {
        if !eos_token_ids.contains(id) {
            eos_token_ids.push(*id);
        }
    }
    let layout = model.kv_layout(config.block_size.max(1));
    let layout = KvLayout { dtype: config.kv_cache_dtype.resolve(dtype, layout.head_dim, &device)?, ..layout };
    let num_blocks = match config.num_kv_blocks {
        Some(n) => n,
        None if device.is_cpu() => KvPool::blocks_for_budget(&layout, config.kv_cache_memory_bytes),
        None => {
            let budget = crate::device::gpu_kv_budget(&device, config.gpu_memory_utilization, config.max_num_batched_tokens)?;
            KvPool::blocks_for_budget(&layout, budget)
        }
    };
    let allocating = Instant::now();
    let mut pool = crate::device::kv_pool(layout, num_blocks, &device)?;
    let kv_scales = crate::kv_cache_dtype::apply_kv_scales(model.kv_scales(), &mut pool.storage)?;
    match kv_scales {
        KvScales::One => tracing::warn!(
            "FP8 KV cache with scale 1.0 in every layer: the checkpoint gives no k_scale / v_scale (K and V beyond +-448 saturate)"
        ),
        KvScales::Unused if model.kv_scales().is_some() => tracing::info!(
            kv_dtype = ?layout.dtype,
            "the checkpoint's FP8 KV cache scales are not used: the cache is not FP8 (--kv-cache-dtype fp8 uses them)"
        ),
        KvScales::Checkpoint | KvScales::Unused => {}
    }
    let (kv_bytes, took) = (num_blocks * layout.bytes_per_block(), allocating.elapsed());
    tracing::info!(
        what = "allocate kv pool", kv_blocks = num_blocks, bytes = kv_bytes, seconds = %format!("{:.3}", took.as_secs_f64()),
        gb_per_s = %format!("{:.3}", kv_bytes as f64 / took.as_secs_f64().max(1e-9) / 1e9), ?device,
        "allocate kv pool: {num_blocks} blocks done"
    );
    tracing::info!(
        model = %served_default,
        params = model_config.num_parameters(),
        %fingerprint,
        %weights,
        ?dtype,
        kv_dtype = ?layout.dtype,
        ?kv_scales,
        ?device,
        kv_blocks = num_blocks,
        block_size = layout.block_size,
        kv_bytes = num_blocks * layout.bytes_per_block(),
        "model loaded"
    );
    Ok(Loaded {
        vocab_size: model_config.vocab_size,
        model,
        pool,
        tokenizer,
        template,
        eos_token_ids,
        served_name: config.served_model_name.clone().unwrap_or(served_default),
        identity: Identity { fingerprint, weights },
    })
}
