//! Command-line flags, spelled like vLLM's, and their mapping onto
//! [`EngineConfig`].

use clap::{Parser, ValueEnum};
use kvc_engine::{EngineConfig, KvCacheDtype, LoadFormat, ModelSource, Quantization};

mod disagg;
mod serving;
pub use disagg::{DisaggArgs, PathPolicyArg};
pub use serving::{ChatTemplateArg, KeyFile, ServingArgs, ToolCallParserArg};

/// Which part a `kvc-server` process plays (README, "Disaggregated serving").
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// A complete worker: prefill and decode in one process.
    Both,
    /// Prefill worker for disaggregated serving.
    Prefill,
    /// Decode worker for disaggregated serving.
    Decode,
    /// OpenAI front routing to several workers.
    Router,
}

impl Role {
    /// The name in logs and `/internal/state` (the flag's value).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Router => "router",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadFormatArg {
    /// Read the checkpoint's safetensors.
    Auto,
    /// Random weights from `--seed` (any config, no weight files needed).
    Dummy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// f32 on a CPU, bf16 on a GPU (a checkpoint of another supported
    /// dtype is converted).
    Auto,
    #[value(alias = "float")]
    Float32,
    Bfloat16,
    #[value(alias = "half")]
    Float16,
}

/// kvc's OpenAI-compatible inference server for Qwen3 / Qwen3-MoE.
#[derive(Debug, Clone, Parser)]
#[command(name = "kvc-server", version, about)]
pub struct Args {
    /// Role of this process (README, "Disaggregated serving"): `both` (a complete worker),
    /// `prefill` / `decode` (disaggregated workers), `router` (OpenAI front
    /// for several workers).
    #[arg(long, value_enum, default_value_t = Role::Both)]
    pub role: Role,

    /// Model directory or Hugging Face hub id; omitted = the embedded tiny
    /// Qwen3-MoE with random weights and the real Qwen3 tokenizer.
    #[arg(long)]
    pub model: Option<String>,

    /// Hub models: the branch, tag or commit to download and serve (vLLM's
    /// flag; default `main`).
    #[arg(long)]
    pub revision: Option<String>,

    /// Hub models: the Hugging Face cache directory to download into and
    /// load from (vLLM's flag; default: HF_HUB_CACHE, else $HF_HOME/hub,
    /// else ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    pub download_dir: Option<std::path::PathBuf>,

    /// Name served by /v1/models and required in requests' `model` field
    /// (default: the model path / hub id, or `kvc-default`).
    #[arg(long)]
    pub served_model_name: Option<String>,

    /// Address to bind. 0.0.0.0 (all interfaces) like vLLM; pass 127.0.0.1
    /// to serve only this machine.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,

    /// Port to listen on for the OpenAI API, /health, /metrics and the
    /// internal worker routes.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Most sequences in one engine step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,

    /// Most tokens (prefill chunks + decodes) in one engine step: the
    /// chunk size of a prefill running alone (vLLM's default for its API
    /// server). Beside decodes, --max-step-ms caps it further.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,

    /// Most sequences mid-prefill at once; short prompts among them go
    /// ahead of long prompts' remaining chunks (vLLM's flag).
    #[arg(long, default_value_t = 4)]
    pub max_num_partial_prefills: usize,

    /// Most long prompts (over --long-prefill-token-threshold tokens to
    /// compute) mid-prefill at once; a long prompt waiting for this slot is
    /// passed by shorter ones (vLLM's flag).
    #[arg(long, default_value_t = 1)]
    pub max_long_partial_prefills: usize,

    /// A prompt with more tokens than this to compute (after cache reuse)
    /// is long; default: 4 % of --max-model-len (vLLM's rule).
    #[arg(long)]
    pub long_prefill_token_threshold: Option<usize>,

    /// Steps in which smaller requests may be admitted past the oldest
    /// waiting one while it waits for KV memory; after that nothing passes
    /// it until it is admitted (0: strict arrival order, as vLLM's FCFS).
    #[arg(long, default_value_t = kvc_engine::config::DEFAULT_MAX_HEAD_OF_LINE_STEPS)]
    pub max_head_of_line_steps: usize,

    /// Step-time budget: a step carries only as many prefill tokens as fit
    /// in this many milliseconds beside its decodes (or alone), from
    /// measured rates, at least 256 and at most --max-num-batched-tokens;
    /// this bounds both the gap between an answer's tokens and the wait of
    /// a new prompt for its first chunk. 0 turns it off.
    #[arg(long, default_value_t = kvc_engine::config::DEFAULT_MAX_STEP_MS)]
    pub max_step_ms: f64,

    /// Target gap between an answer's tokens: after a step with prefill
    /// that took longer, the next two steps run the decodes alone, as
    /// long as the prompt tokens waiting would be computed within 0.5 s at
    /// the measured rate (a longer queue gets every step's prefill). 0
    /// turns it off.
    #[arg(long, default_value_t = 0.0, value_parser = parse_nonneg_f64)]
    pub itl_target_ms: f64,

    /// Context cap (prompt + completion); default: the model's maximum.
    #[arg(long)]
    pub max_model_len: Option<usize>,

    /// Number of KV blocks; overrides --kv-cache-memory.
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,

    /// KV pool budget in bytes; suffixes KiB/MiB/GiB/TiB (or K/M/G/T) are
    /// powers of 1024, KB/MB/GB/TB powers of 1000.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    pub kv_cache_memory: usize,

    /// KV block size in tokens.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,

    /// How to obtain the weights: read the checkpoint, or random weights
    /// at the model's shape (benchmarks, tests).
    #[arg(long, value_enum, default_value_t = LoadFormatArg::Auto)]
    pub load_format: LoadFormatArg,

    /// Data type the model computes in: its weights, activations and KV
    /// cache.
    #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
    pub dtype: DtypeArg,

    /// What the KV cache stores (vLLM's flag): `auto` (the compute
    /// dtype), `bf16` (`bfloat16`) or `fp8` (`fp8_e4m3`: e4m3 with a scale
    /// per layer of 1.0, half of bf16's bytes per block, so twice the
    /// sessions fit the same memory and the host tier and P/D transfers
    /// move half the bytes). The CPU path takes all three; a GPU the
    /// compute dtype or `fp8`. A P/D pair must agree (the handshake
    /// refuses).
    #[arg(long, default_value = "auto", value_parser = KvCacheDtype::parse)]
    pub kv_cache_dtype: KvCacheDtype,

    /// Quantize the weights at load (vLLM's flag): `fp8` makes a plain
    /// bf16 / f16 / f32 checkpoint's decoder projections block FP8 as they
    /// are read (e4m3, one scale per 128x128 block, as Qwen's official FP8
    /// checkpoints are made): on an H100/H200 they run on the FP8 GEMMs in
    /// half the weight memory, on the CPU the same quantized values are
    /// served. A block-FP8 checkpoint needs no flag (it keeps its own
    /// scales). Other methods are refused by name.
    #[arg(long, value_parser = Quantization::parse)]
    pub quantization: Option<Quantization>,

    /// `auto` (CUDA device 0 when built with `--features cuda` and one is
    /// present, else the CPU), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,

    /// GPU only: share of the GPU's memory the server may use in all
    /// (weights, activations, KV pool), as vLLM's flag; the KV pool gets
    /// the rest unless --num-kv-blocks is given.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,

    /// GPU only: run every step eagerly, never as a CUDA graph (vLLM's
    /// flag). By default decode steps of up to 512 sequences (at most
    /// `--max-num-seqs`) run as CUDA graphs, one per bucket of batch sizes
    /// (1, 2, 4, then multiples of 8, as vLLM captures), captured at first
    /// use; a batch is padded to its bucket.
    #[arg(long)]
    pub enforce_eager: bool,

    /// Seed for dummy weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Turn off the prefix cache (vLLM's flag); sessions still keep their KV.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,

    /// Keep no KV for sessions: `session_id` / `x-session-id` are still
    /// checked, but every turn starts cold (the prefix cache still applies).
    /// The "naive P/D" baseline of docs/experiments/headline.md.
    #[arg(long)]
    pub no_enable_session_cache: bool,

    /// Host memory for session KV evicted from the pool, in GiB (vLLM's
    /// `--swap-space`); 0 disables the host tier. On a prefill worker the
    /// snapshot store's demoted entries use it too.
    #[arg(long, default_value_t = 1.0)]
    pub swap_space: f64,

    /// GPU pools with a host tier: when free blocks plus idle sessions'
    /// blocks already copied to the host fall under this share of the pool,
    /// idle sessions' blocks are copied to the host ahead of need (on the
    /// copy stream, while they stay on the GPU), so that evicting them later
    /// costs no copy on a request's critical path; 0 disables it.
    #[arg(long, default_value_t = 0.1, value_parser = parse_fraction)]
    pub host_write_back_watermark: f64,

    /// Idle sessions are deleted after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub session_ttl_s: u64,

    /// Most sessions kept per API key (per server when keys are not told
    /// apart; 0: no limit). A key's new session past it drops that key's
    /// least recently used idle session, never another key's.
    #[arg(long, default_value_t = 0)]
    pub max_sessions_per_key: usize,

    #[command(flatten)]
    pub serving: ServingArgs,

    #[command(flatten)]
    pub disagg: DisaggArgs,
}

impl Args {
    /// Refuses flag combinations a role cannot use, with a message for the user.
    pub fn check_role(&self) -> Result<(), String> {
        let d = &self.disagg;
        match self.role {
            Role::Both | Role::Prefill if !d.prefill_peers.is_empty() || !d.decode_peers.is_empty() => {
                Err(format!("--role {} takes no --prefill-peer / --decode-peer (decode workers and the router do)", self.role_name()))
            }
            Role::Router if d.decode_peers.is_empty() => {
                Err("--role router needs at least one --decode-peer URL (a decode or both worker)".into())
            }
            Role::Decode if d.prefill_peers.is_empty() => Err("--role decode needs at least one --prefill-peer URL".into()),
            Role::Router if self.serving.max_queue_delay_s.is_some() => {
                Err("--role router takes no --max-queue-delay-s: each worker bounds its own prefill queue (give it to each of them)".into())
            }
            Role::Router if self.serving.chat_template.is_some() => {
                Err("--role router takes no --chat-template: the workers render the prompts (give it to each of them)".into())
            }
            Role::Prefill | Role::Decode | Role::Router if self.serving.cluster_token.as_deref().unwrap_or("").is_empty() => Err(format!(
                "--role {} needs --cluster-token (or KVC_CLUSTER_TOKEN): worker-to-worker calls are authenticated",
                self.role_name()
            )),
            _ => Ok(()),
        }
    }

    pub fn role_name(&self) -> String {
        self.role.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
    }

    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            model: ModelSource::parse(self.model.as_deref()),
            chat_template: self.serving.chat_template.as_ref().map(|t| t.0.clone()),
            load_format: match self.load_format {
                LoadFormatArg::Auto => LoadFormat::Auto,
                LoadFormatArg::Dummy => LoadFormat::Dummy,
            },
            served_model_name: self.served_model_name.clone(),
            revision: self.revision.clone(),
            download_dir: self.download_dir.clone(),
            dtype: match self.dtype {
                DtypeArg::Auto => None,
                DtypeArg::Float32 => Some("f32".to_string()),
                DtypeArg::Bfloat16 => Some("bf16".to_string()),
                DtypeArg::Float16 => Some("f16".to_string()),
            },
            kv_cache_dtype: self.kv_cache_dtype,
            quantization: self.quantization.unwrap_or_default(),
            block_size: self.block_size,
            num_kv_blocks: self.num_kv_blocks,
            kv_cache_memory_bytes: self.kv_cache_memory,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_partial_prefills: self.max_num_partial_prefills,
            max_long_partial_prefills: self.max_long_partial_prefills,
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            max_head_of_line_steps: self.max_head_of_line_steps,
            max_step_ms: (self.max_step_ms > 0.0).then_some(self.max_step_ms),
            itl_target_ms: (self.itl_target_ms > 0.0).then_some(self.itl_target_ms),
            max_model_len: self.max_model_len,
            seed: self.seed,
            enable_prefix_caching: !self.no_enable_prefix_caching,
            swap_space_bytes: (self.swap_space.max(0.0) * (1u64 << 30) as f64) as usize,
            host_write_back_watermark: self.host_write_back_watermark,
            session_ttl_s: self.session_ttl_s,
            max_sessions_per_key: self.max_sessions_per_key,
            snapshot_min_tokens: if self.role == Role::Decode { self.disagg.snapshot_min_tokens } else { 0 },
            snapshot_store_blocks: match self.role {
                Role::Prefill => self.disagg.snapshot_store_blocks.unwrap_or(kvc_engine::config::HALF_THE_POOL),
                _ => 0,
            },
            device: self.device.clone(),
            gpu_memory_utilization: self.gpu_memory_utilization,
            enforce_eager: self.enforce_eager,
            ..EngineConfig::default()
        }
    }
}

pub fn parse_nonneg_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a non-negative number")),
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number from 0 to 1, got '{s}'")),
    }
}

fn parse_positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

/// Parses a byte count such as `1073741824`, `512MiB`, `2GiB`, `2G` or `1.5GB`.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0_f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("unknown unit {unit:?} in {s:?} (use e.g. 512MiB, 2GiB, 1GB or a plain byte count)")),
    };
    let value: f64 = num.parse().map_err(|_| format!("{s:?} is not a byte count (use e.g. 512MiB, 2GiB)"))?;
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes > usize::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("kvc-server").chain(args.iter().copied()))
    }

    #[test]
    fn kv_cache_dtype_takes_vllms_spellings_and_refuses_the_others_by_name() {
        assert_eq!(parse(&[]).unwrap().engine_config().kv_cache_dtype, KvCacheDtype::Auto);
        for (v, want) in [
            ("fp8", KvCacheDtype::Fp8E4m3),
            ("fp8_e4m3", KvCacheDtype::Fp8E4m3),
            ("bfloat16", KvCacheDtype::Bf16),
            ("auto", KvCacheDtype::Auto),
        ] {
            assert_eq!(parse(&["--kv-cache-dtype", v]).unwrap().engine_config().kv_cache_dtype, want, "{v}");
        }
        let e = parse(&["--kv-cache-dtype", "fp8_e5m2"]).unwrap_err().to_string();
        assert!(e.contains("fp8_e5m2") && e.contains("not implemented"), "{e}");
    }

    #[test]
    fn quantization_takes_fp8_and_refuses_the_methods_kvc_lacks_by_name() {
        assert_eq!(parse(&[]).unwrap().engine_config().quantization, Quantization::None);
        assert_eq!(parse(&["--quantization", "fp8"]).unwrap().engine_config().quantization, Quantization::Fp8);
        let e = parse(&["--quantization", "awq"]).unwrap_err().to_string();
        assert!(e.contains("awq") && e.contains("not implemented"), "{e}");
    }

    #[test]
    fn byte_sizes_accept_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("2g").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("1.5KiB").unwrap(), 1536);
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("0").is_err());
        assert_eq!(parse_fraction("0.25"), Ok(0.25));
        assert!(parse_fraction("1.5").is_err() && parse_fraction("-0.1").is_err() && parse_fraction("x").is_err());
    }

    #[test]
    fn defaults_match_vllm_and_engine() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.role, Role::Both);
        assert_eq!(a.host, "0.0.0.0");
        assert_eq!(a.port, 8000);
        let c = a.engine_config();
        let d = EngineConfig::default();
        assert_eq!(c.model, ModelSource::Embedded);
        assert_eq!(c.block_size, d.block_size);
        assert_eq!(c.kv_cache_memory_bytes, d.kv_cache_memory_bytes);
        assert_eq!(c.max_num_seqs, d.max_num_seqs);
        assert_eq!(c.max_num_batched_tokens, d.max_num_batched_tokens);
        assert_eq!(c.max_num_partial_prefills, d.max_num_partial_prefills);
        assert_eq!(c.max_long_partial_prefills, d.max_long_partial_prefills);
        assert_eq!(c.long_prefill_token_threshold, d.long_prefill_token_threshold);
        assert_eq!(c.max_head_of_line_steps, d.max_head_of_line_steps);
        assert_eq!(c.max_step_ms, d.max_step_ms);
        assert_eq!(c.host_write_back_watermark, d.host_write_back_watermark);
        assert_eq!(c.dtype, None);
    }

    #[test]
    fn flags_map_onto_engine_config() {
        let a = parse(&[
            "--served-model-name",
            "m",
            "--max-model-len",
            "4096",
            "--num-kv-blocks",
            "100",
            "--kv-cache-memory",
            "2GiB",
            "--block-size",
            "32",
            "--load-format",
            "dummy",
            "--dtype",
            "bfloat16",
            "--seed",
            "7",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "1024",
            "--max-num-partial-prefills",
            "3",
            "--max-long-partial-prefills",
            "2",
            "--long-prefill-token-threshold",
            "900",
            "--max-step-ms",
            "0",
        ])
        .unwrap();
        let c = a.engine_config();
        assert_eq!(c.served_model_name.as_deref(), Some("m"));
        assert_eq!((c.max_num_partial_prefills, c.max_long_partial_prefills), (3, 2));
        assert_eq!((c.long_prefill_token_threshold, c.max_step_ms), (Some(900), None));
        assert_eq!(c.max_model_len, Some(4096));
        assert_eq!(c.num_kv_blocks, Some(100));
        assert_eq!(c.kv_cache_memory_bytes, 2 << 30);
        assert_eq!(c.block_size, 32);
        assert_eq!(c.load_format, LoadFormat::Dummy);
        assert_eq!(c.dtype.as_deref(), Some("bf16"));
        assert_eq!(c.seed, 7);
        assert_eq!(c.max_num_seqs, 8);
        assert_eq!(c.max_num_batched_tokens, 1024);
        assert_eq!(parse(&["--dtype", "half"]).unwrap().engine_config().dtype.as_deref(), Some("f16"));
    }

    #[test]
    fn serving_flags_map_onto_server_config() {
        let c = parse(&[]).unwrap().serving.server_config();
        assert!(c.api_keys.is_empty());
        assert_eq!(c.max_request_body_bytes, 16 << 20);
        assert_eq!(c.request_timeout, None);
        assert_eq!(c.shutdown_timeout, Duration::from_secs(30));
        let c = parse(&[
            "--api-key",
            "k",
            "--cluster-token",
            "t",
            "--max-request-body-bytes",
            "1MiB",
            "--max-prompt-tokens",
            "64",
            "--max-concurrent-requests",
            "2",
            "--max-queued-requests",
            "3",
            "--request-timeout-s",
            "5",
            "--shutdown-timeout-s",
            "1",
        ])
        .unwrap()
        .serving
        .server_config();
        assert_eq!((c.api_keys.as_slice(), c.cluster_token.as_deref()), (&["k".to_string()][..], Some("t")));
        assert_eq!((c.max_request_body_bytes, c.max_prompt_tokens), (1 << 20, Some(64)));
        assert_eq!((c.max_concurrent_requests, c.max_queued_requests), (2, 3));
        assert_eq!((c.request_timeout, c.shutdown_timeout), (Some(Duration::from_secs(5)), Duration::from_secs(1)));
        // An empty key is no key (a blank environment variable must not lock everyone out).
        assert!(parse(&["--api-key", ""]).unwrap().serving.server_config().api_keys.is_empty());
        // Several keys: repeated flags and a key file, duplicates once.
        let file = std::env::temp_dir().join(format!("kvc-keys-{}", std::process::id()));
        std::fs::write(&file, "# team keys\nk2\n\n  k3  \nk1\n").unwrap();
        let c = parse(&["--api-key", "k1", "--api-key", "k2", "--api-key-file", file.to_str().unwrap()]).unwrap().serving.server_config();
        assert_eq!(c.api_keys, ["k1", "k2", "k3"]);
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(parse(&["--api-key-file", file.to_str().unwrap()]).is_err(), "an empty key file is refused");
        std::fs::remove_file(&file).unwrap();
        // Secrets stay out of logs.
        let shown = format!("{:?}", parse(&["--api-key", "hunter2", "--cluster-token", "t0k"]).unwrap().serving.server_config());
        assert!(!shown.contains("hunter2") && !shown.contains("t0k"), "{shown}");
    }

    #[test]
    fn roles_check_their_peers_and_token() {
        let err = |args: &[&str]| parse(args).unwrap().check_role().unwrap_err();
        assert!(err(&["--role", "router"]).contains("--decode-peer"));
        assert!(err(&["--role", "decode", "--cluster-token", "t"]).contains("--prefill-peer"));
        assert!(err(&["--role", "decode", "--prefill-peer", "http://p"]).contains("--cluster-token"));
        assert!(err(&["--role", "prefill"]).contains("--cluster-token"));
        assert!(err(&["--role", "both", "--prefill-peer", "http://p"]).contains("takes no"));
        assert!(parse(&["--role", "both"]).unwrap().check_role().is_ok());
        assert!(parse(&["--role", "prefill", "--cluster-token", "t"]).unwrap().check_role().is_ok());
        let ok = ["--role", "decode", "--cluster-token", "t", "--prefill-peer", "http://p:1", "--prefill-peer", "http://q:2"];
        assert_eq!(parse(&ok).unwrap().disagg.prefill_peers.len(), 2);
        assert!(err(&["--role", "router", "--decode-peer", "http://d"]).contains("--cluster-token"));
        assert!(parse(&["--role", "router", "--decode-peer", "http://d", "--cluster-token", "t"]).unwrap().check_role().is_ok());
        assert!(parse(&["--role", "nonsense"]).is_err());
    }

    #[test]
    fn the_router_overlap_weight_is_a_non_negative_number() {
        assert_eq!(parse(&[]).unwrap().disagg.kv_overlap_score_weight, 1.0);
        assert_eq!(parse(&["--kv-overlap-score-weight", "8"]).unwrap().disagg.kv_overlap_score_weight, 8.0);
        assert!(parse(&["--kv-overlap-score-weight", "-1"]).is_err());
        assert!(parse(&["--kv-overlap-score-weight", "NaN"]).is_err());
    }
}
