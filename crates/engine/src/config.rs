//! Engine configuration (the server maps its vLLM-style flags onto this).

use std::path::PathBuf;

use kvc_model_loading::model_source::{LoadFormat, ModelSource};

/// Default `host_write_back_watermark`: a tenth of the pool kept free or
/// free to take.
pub const DEFAULT_HOST_WRITE_BACK_WATERMARK: f64 = 0.1;

/// Default `max_step_ms`: steps stay near 100 ms, so an answer streams at
/// 10 tokens/s or better while prompts are prefilled beside it, and a new
/// prompt waits at most about one step for its first chunk.
pub const DEFAULT_MAX_STEP_MS: f64 = 100.0;

/// Default of [`EngineConfig::max_head_of_line_steps`].
pub const DEFAULT_MAX_HEAD_OF_LINE_STEPS: usize = kvc_scheduler::DEFAULT_MAX_HEAD_OF_LINE_STEPS;

/// `snapshot_store_blocks` value meaning half of the pool.
pub const HALF_THE_POOL: usize = usize::MAX;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: ModelSource,
    /// A chat template that replaces the model's (`--chat-template`: its
    /// source text).
    pub chat_template: Option<String>,
    pub load_format: LoadFormat,
    /// Name reported by `/v1/models` and accepted in requests; defaults to the
    /// model path / hub id, or `kvc-default` for the embedded model.
    pub served_model_name: Option<String>,
    /// Hub models: branch, tag or commit (None: `main`).
    pub revision: Option<String>,
    /// Hub models: the cache directory to download into and load from
    /// (None: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else ~/.cache/huggingface/hub).
    pub download_dir: Option<PathBuf>,
    /// "f32", "bf16", "f16" or None for the checkpoint's dtype (f32 on CPU
    /// when the checkpoint is bf16 and the device is a CPU).
    pub dtype: Option<String>,
    /// What the KV pool stores (`--kv-cache-dtype`).
    pub kv_cache_dtype: crate::KvCacheDtype,
    /// Weights quantized at load (`--quantization`).
    pub quantization: crate::Quantization,
    /// KV block size in tokens.
    pub block_size: usize,
    /// Number of KV blocks; when None, derived from `kv_cache_memory_bytes`.
    pub num_kv_blocks: Option<usize>,
    /// Memory budget for the KV pool when `num_kv_blocks` is None.
    pub kv_cache_memory_bytes: usize,
    /// Sequences per step.
    pub max_num_seqs: usize,
    /// Tokens per step (prefill chunks + decodes).
    pub max_num_batched_tokens: usize,
    /// Most sequences mid-prefill at once (vLLM's flag).
    pub max_num_partial_prefills: usize,
    /// Most long prompts mid-prefill at once (vLLM's flag).
    pub max_long_partial_prefills: usize,
    /// Prompts with more tokens than this to compute are long; None: 4 %
    /// of the context cap (vLLM's rule).
    pub long_prefill_token_threshold: Option<usize>,
    /// Steps in which smaller prompts may pass the oldest waiting one
    /// while it waits for KV memory (see kvc-scheduler's head-of-line bound).
    pub max_head_of_line_steps: usize,
    /// Step-time target: a step's prefill tokens are capped so that it
    /// stays within this, beside its decodes or alone, from measured rates
    /// (None: no cap beyond `max_num_batched_tokens`).
    pub max_step_ms: Option<f64>,
    /// Target gap between a decode's tokens: when a step with prefill
    /// took longer, the next steps run the decodes alone while prefill has
    /// slack (`kvc_policy::step_kind`; None: never).
    pub itl_target_ms: Option<f64>,
    /// Seconds of waiting prefill (at the measured rate) up to which those
    /// decode-only steps are taken (`kvc_policy::step_kind::BACKLOG_SLACK_S`).
    pub itl_backlog_slack_s: f64,
    /// KV growth, in tokens, reserved at admission for each running
    /// sequence (see kvc-scheduler).
    pub growth_reserve_tokens: usize,
    /// Context cap; None = the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Seed for dummy weights.
    pub seed: u64,
    /// Reuse full blocks across requests by chained hash.
    pub enable_prefix_caching: bool,
    /// Host-memory tier for evicted session KV, in bytes (0 disables it).
    pub swap_space_bytes: usize,
    /// Share of the pool under which free plus written-back blocks start
    /// write-back of idle sessions to an asynchronous host tier (0: never).
    pub host_write_back_watermark: f64,
    /// Idle sessions are deleted after this many seconds.
    pub session_ttl_s: u64,
    /// Most sessions kept per API-key namespace (0: no limit).
    pub max_sessions_per_key: usize,
    /// Decode workers: after a committed turn, emit a snapshot job when the
    /// session has at least this many tokens not yet pushed (0: never).
    pub snapshot_min_tokens: usize,
    /// Prefill workers: blocks the snapshot store may hold (0: no store;
    /// [`HALF_THE_POOL`]: half of the pool's blocks).
    pub snapshot_store_blocks: usize,
    /// `auto`, `cpu`, `cuda` or `cuda:N` (crate::device).
    pub device: String,
    /// On a GPU without `num_kv_blocks`: the share of the GPU's memory the
    /// engine may use in all; the KV pool gets what the weights leave.
    pub gpu_memory_utilization: f64,
    /// On a GPU: never run a step as a CUDA graph (otherwise decode steps
    /// of up to [`CUDA_GRAPH_MAX_BATCH`] sequences are).
    pub enforce_eager: bool,
    /// The GPU kernels asked for (`kvc_policy::kernel_plan`; the server
    /// reads them from the environment once, crate::kernel_plan), decided
    /// against the device when the model loads.
    pub kernels: kvc_policy::kernel_plan::KernelRequest,
}

/// Largest decode batch run as a CUDA graph (vLLM's default largest
/// capture size; `--max-num-seqs` lowers it). Graphs are kept one per
/// bucket of batch sizes (1, 2, 4, then multiples of 8:
/// kvc_model_qwen3::graph_bucket), a batch padded to its bucket, so at
/// most 67 of them. On CUTLASS's expert GEMM (sm90) graphs beat eager steps
/// at every measured batch (docs/benchmarks.md).
pub const CUDA_GRAPH_MAX_BATCH: usize = 512;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: ModelSource::Embedded,
            chat_template: None,
            load_format: LoadFormat::Auto,
            served_model_name: None,
            revision: None,
            download_dir: None,
            dtype: None,
            kv_cache_dtype: crate::KvCacheDtype::Auto,
            quantization: crate::Quantization::None,
            block_size: 16,
            num_kv_blocks: None,
            kv_cache_memory_bytes: 512 << 20,
            snapshot_min_tokens: 0,
            snapshot_store_blocks: 0,
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_num_partial_prefills: 4,
            max_long_partial_prefills: 1,
            long_prefill_token_threshold: None,
            max_step_ms: Some(DEFAULT_MAX_STEP_MS),
            itl_target_ms: None,
            itl_backlog_slack_s: kvc_policy::step_kind::BACKLOG_SLACK_S,
            growth_reserve_tokens: kvc_scheduler::DEFAULT_GROWTH_RESERVE_TOKENS,
            max_head_of_line_steps: kvc_scheduler::DEFAULT_MAX_HEAD_OF_LINE_STEPS,
            max_model_len: None,
            seed: 0,
            enable_prefix_caching: true,
            swap_space_bytes: 1 << 30,
            host_write_back_watermark: DEFAULT_HOST_WRITE_BACK_WATERMARK,
            session_ttl_s: 600,
            max_sessions_per_key: 0,
            device: "auto".to_string(),
            gpu_memory_utilization: 0.9,
            enforce_eager: false,
            kernels: Default::default(),
        }
    }
}
