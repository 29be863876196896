//! kvc's HTTP front over an [`kvc_engine::EngineHandle`].
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI API (plus
//!   vLLM's extensions: `top_k`, `min_p`, `repetition_penalty`,
//!   `stop_token_ids`, `ignore_eos`, `skip_special_tokens`,
//!   `chat_template_kwargs`, `add_generation_prompt`, `add_special_tokens`),
//!   streaming as SSE. Every answer says how it was served: header
//!   `x-kvc-path` and body field `kvc` (DESIGN.md §5).
//! - `GET /v1/models`, `GET /v1/models/{model}`.
//! - `GET /health`, `GET /metrics` (Prometheus text).
//!
//! Errors are OpenAI error JSON, produced by [`error::error_response`] only.

pub mod app;
pub mod args;
pub mod chat;
pub mod completions;
pub mod error;
pub mod extract;
pub mod generate;
pub mod health;
pub mod metrics;
pub mod models;
pub mod openai_types;
pub mod sampling;
pub mod sse;
