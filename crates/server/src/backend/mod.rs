//! How this worker serves a generation, chosen once at start from its role
//! ([`choice::choose`]), as TGI serves every backend through one `Backend`
//! trait:
//!
//! - [`local::Local`]: every sequence is computed by this worker's engine
//!   (`--role both`, and a prefill worker's own `/v1/*` requests);
//! - [`decode_worker::DecodeWorker`]: a single-choice request may have its
//!   prompt computed by a prefill worker ([`crate::pd::decode`]); what
//!   cannot go remote (several choices or prompts, prompt logprobs) is
//!   computed here and says so (`kvc.reason`).
//!
//! Handlers reach the role only through `AppState::backend`: what to
//! submit ([`Backend::submit`], with what it is served by: [`Serving`]),
//! the role ([`Backend::role`]) and the KV-transfer state of a prefill or
//! decode worker ([`Backend::disagg`]). Readiness and the published state
//! are the same for every role ([`crate::health`], [`crate::worker_state`]).

pub mod choice;
pub mod decode_worker;
pub mod local;

use futures::future::BoxFuture;
use kvc_engine::{EngineError, EngineHandle, RequestStream, SamplingParams};

use crate::args::Role;
use crate::error::ApiError;
use crate::pd::PdState;
use crate::prompt_route::Route;
use crate::server_metrics::ServerMetrics;

/// What to submit: one prompt, `n` choices.
pub struct Submission {
    pub prompt_tokens: Vec<u32>,
    pub sampling: SamplingParams,
    pub n: usize,
    pub session_id: Option<String>,
    /// The salt the prompt's cached blocks are hashed under
    /// ([`crate::tenant::Tenant::cache_salt`]).
    pub cache_salt: Option<String>,
    /// `sampling.constraint`, compiled.
    pub grammar: Option<kvc_engine::CompiledGrammar>,
    /// Attaches the endpoint's prompt name to engine errors.
    pub map_err: fn(EngineError) -> ApiError,
}

/// A submitted request: one engine stream per choice, in choice order
/// (prompt `p`'s choice `i` is choice `sum(n of the prompts before p) + i`),
/// and how its prompt was served.
pub struct Started {
    pub streams: Vec<RequestStream>,
    pub route: Route,
}

/// What a backend serves a submission with: the worker's engine, its
/// metrics and its `--max-queue-delay-s` (the worker's `AppState` lends
/// them).
#[derive(Clone, Copy)]
pub struct Serving<'a> {
    pub engine: &'a EngineHandle,
    pub metrics: &'a ServerMetrics,
    pub max_queue_delay_s: Option<f64>,
}

/// A worker's way of serving generations.
pub trait Backend: Send + Sync {
    /// The role this worker publishes (`/internal/state`) and logs.
    fn role(&self) -> Role;

    /// Starts every choice of `subs` (validated and admitted, under
    /// `request_id`); the caller bounds it by the request's deadline.
    fn submit<'a>(&'a self, serving: Serving<'a>, request_id: &'a str, subs: &'a [Submission]) -> BoxFuture<'a, Result<Started, ApiError>>;

    /// The KV link, peers and counters of a prefill or decode worker
    /// (None: this worker takes no KV transfers).
    fn disagg(&self) -> Option<&PdState> {
        None
    }
}
