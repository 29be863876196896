//! kvc's engine: the step loop that turns requests into tokens.
//!
//! [`EngineHandle::start`] loads the model and tokenizer, allocates the KV
//! pool and runs the step loop on its own thread (scheduler -> batch ->
//! model -> sampler -> detokenizer -> per-request streams). The handle is
//! cheap to clone and is all the server needs.
//!
//! The loop knows no role. KV that moves by transfer (reservations for a
//! remote prefill, leases on blocks being sent; [`KvLease`],
//! [`Reservation`]) is answered by any engine; what only one role keeps (a
//! prefill worker's snapshot store, a decode worker's snapshot pushes) is
//! a part chosen once from [`EngineConfig`] (`snapshot_store_blocks`,
//! `snapshot_min_tokens`), whose hooks the loop calls at fixed points.

pub mod admission;
mod command;
pub mod config;
pub mod device;
mod engine_loop;
pub mod error;
mod fingerprint;
mod handle;
mod inbox;
pub mod kernel_plan;
pub mod kv_cache_dtype;
mod kv_handoff;
mod loaded;
pub mod quantization;
pub mod reference_score;
pub mod request;
pub mod sampler;
mod stats;
pub mod step_model;

pub use admission::{decide_admission, AdmissionDecision, AdmissionQuery};
pub use command::{PrefixCacheReset, SnapshotSlot};
pub use config::EngineConfig;
pub use engine_loop::stall_reasons;
pub use error::EngineError;
pub use handle::{CancelGuard, EngineHandle, ModelInfo, RequestStream};
pub use kv_cache_dtype::KvCacheDtype;
pub use kv_handoff::{KvLease, Reservation, SnapshotJob};
pub use kvc_model_loading::model_source::{LoadFormat, ModelSource, EMBEDDED_CONFIG, EMBEDDED_MODEL_NAME};
/// How a client's session id is scoped by tenant and salt (the server's
/// handlers and its router use these; the cache keys sessions by them).
pub use kvc_session_cache::{client_session_id, is_valid_client_part, scoped_session_id};
pub use kvc_session_cache::{CacheStats, ReusePath, SessionInfo, SnapshotInfo, SnapshotStats, Tier};
pub use kvc_text_front::{CompiledGrammar, GrammarCompiler};
pub use kvc_wire::{Constraint, Grammar, ReasoningGate};
pub use quantization::Quantization;
pub use request::{FinishReason, GenerateRequest, Logprobs, MatchedStop, SamplingParams, ServePath, StreamEvent, TokenLogprob, Usage};
pub use stats::EngineStats;
