//! kvc's HTTP front over an [`kvc_engine::EngineHandle`].
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI API with
//!   `logprobs`, `n`, `echo`, `logit_bias`, stop strings, tools
//!   ([`tool_parser`]) and reasoning ([`reasoning_parser`]), plus vLLM's
//!   extensions (`top_k`, `min_p`, `min_tokens`, `repetition_penalty`,
//!   `stop_token_ids`, `ignore_eos`, `skip_special_tokens`,
//!   `chat_template_kwargs`, `add_generation_prompt`, `add_special_tokens`,
//!   `continue_final_message`, `stream_options.continuous_usage_stats`)
//!   and kvc's `session_id`; unknown top-level fields are refused
//!   ([`request_fields`]). Streaming as SSE. Every answer says how it was
//!   served: header `x-kvc-path` and body field `kvc` (README, "Sessions").
//! - Security and limits: [`auth`] (`--api-key`, `--cluster-token`),
//!   [`request_slots`] (concurrency, queue, 429), body and prompt limits, a
//!   per-request timeout ([`generate`]), graceful shutdown ([`shutdown`]),
//!   protocol errors answered as error JSON ([`protocol_errors`]).
//! - `GET /v1/models`, `GET /v1/models/{model}`.
//! - Sessions ([`sessions`]): `GET/DELETE /v1/sessions/{id}`, the
//!   admission probe `POST /v1/admission`, `POST /reset_prefix_cache`.
//! - `GET /health` (readiness), `GET /health/live`, `GET /metrics`
//!   (Prometheus text).
//! - `/internal/*`: worker-to-worker routes behind `--cluster-token`.
//! - Roles: a worker serves generations through one [`backend::Backend`],
//!   chosen once at start from `--role` ([`backend::local::Local`] for
//!   `both` and `prefill`, [`backend::decode_worker::DecodeWorker`] for
//!   `decode`); [`pd`] holds the prefill and decode workers' KV link, peers
//!   and routes; [`router`] is an app of its own. Router and decode worker watch their peers through
//!   one poller ([`peer_poll`]) and correct the peers' lagging reports by
//!   what they sent and have not had answered ([`in_flight`]).
//! - Layout: handlers share [`state::AppState`]; the route table and
//!   serving are [`routes`], which no handler imports.
//!
//! Errors are OpenAI error JSON, produced by [`error::error_response`] only.

pub mod args;
pub mod auth;
pub mod backend;
pub mod chat;
pub mod chat_messages;
pub mod chat_output;
pub mod cluster_token;
pub mod completion_endpoint;
pub mod completion_prompts;
pub mod completions;
pub mod config_reference;
pub mod endpoint;
pub mod error;
pub mod extract;
pub mod generate;
pub mod health;
pub mod in_flight;
pub mod internal;
pub mod loading;
pub mod logprobs;
pub mod metrics;
pub mod models;
pub mod openai_types;
pub mod pd;
pub mod peer_poll;
pub mod prom;
pub mod prompt_route;
pub mod protocol_errors;
pub mod queue_delay;
pub mod reasoning_parser;
pub mod request_fields;
pub mod request_slots;
pub mod response;
pub mod router;
pub mod routes;
pub mod sampling;
pub mod server_metrics;
pub mod sessions;
pub mod shutdown;
pub mod sse;
pub mod state;
pub mod structured;
pub mod tenant;
pub mod tool_call_text;
pub mod tool_grammar_qwen3_coder;
pub mod tool_limit;
pub mod tool_parser;
pub mod tool_parser_qwen3_coder;
pub mod tool_schema_qwen3_coder;
pub mod worker_state;
