//! How this worker serves a generation, chosen once at start from its role
//! ([`start`]), as TGI serves every backend through one `Backend` trait:
//!
//! - [`Local`]: every sequence is computed by this worker's engine
//!   (`--role both`, and a prefill worker's own `/v1/*` requests);
//! - [`DecodeWorker`]: a single-choice request may have its prompt
//!   computed by a prefill worker ([`crate::pd::decode`]); what cannot go
//!   remote (several choices or prompts, prompt logprobs) is computed here
//!   and says so (`kvc.reason`).
//!
//! Handlers reach the role only through [`AppState::backend`]: what to
//! submit ([`Backend::submit`]), readiness ([`Backend::health`]), the
//! published state ([`Backend::worker_state`]) and the KV-transfer state of
//! a prefill or decode worker ([`Backend::disagg`]).

pub mod decode_worker;
pub mod local;

use std::sync::Arc;

use axum::http::StatusCode;
use futures::future::BoxFuture;
use kvc_disagg::prefill_path::{FallbackReason, PathReason};
use kvc_disagg::protocol::WorkerState;
use kvc_engine::{EngineError, EngineHandle, RequestStream, SamplingParams, ServePath};
use serde_json::Value;

pub use decode_worker::DecodeWorker;
pub use local::Local;

use crate::args::{Args, Role};
use crate::error::ApiError;
use crate::pd::PdState;
use crate::state::AppState;

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

/// How a request's prompt was served (the `kvc` body field and
/// `x-kvc-path`); the default (no reason) says nothing beyond the
/// engine's own usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Route {
    pub path: ServePath,
    pub reason: Option<RouteReason>,
    /// Prompt tokens computed by a prefill worker (remote paths).
    pub remote_computed_tokens: Option<usize>,
    pub transferred_tokens: usize,
}

/// Why a decode worker served a prompt where it did: the typed reason of
/// the decision behind it, whose label is the `kvc.reason` body field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteReason {
    /// The prefill-path decision's reason.
    Path(PathReason),
    /// A remote prefill failed and the prompt was computed here (the
    /// `prefill_fallback` decision's reason).
    Fallback(FallbackReason),
}

impl RouteReason {
    /// The `kvc.reason` label: the path decision's reason label, or
    /// `fallback_` and the fallback's.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::Path(r) => r.as_str(),
            RouteReason::Fallback(FallbackReason::RemotePrefillFailed) => "fallback_remote_prefill_failed",
        }
    }
}

/// A submitted request: one engine stream per choice, in choice order
/// (prompt `p`'s choice `i` is choice `sum(n of the prompts before p) + i`),
/// and how its prompt was served.
pub struct Started {
    pub streams: Vec<RequestStream>,
    pub route: Route,
}

/// A worker's way of serving generations.
pub trait Backend: Send + Sync {
    /// The role this worker publishes (`/internal/state`) and logs.
    fn role(&self) -> Role;

    /// Starts every choice of `subs` (validated and admitted, under
    /// `request_id`); the caller bounds it by the request's deadline.
    fn submit<'a>(&'a self, state: &'a AppState, request_id: &'a str, subs: &'a [Submission]) -> BoxFuture<'a, Result<Started, ApiError>>;

    /// Readiness (`GET /health`): [`crate::health::ready`].
    fn health(&self, state: &AppState) -> (StatusCode, Value) {
        crate::health::ready(state)
    }

    /// What this worker publishes to the router and its peers
    /// (`GET /internal/state`).
    fn worker_state(&self, state: &AppState) -> WorkerState {
        crate::worker_state::published(state, self.role(), self.health(state).0.is_success())
    }

    /// The KV link, peers and counters of a prefill or decode worker
    /// (None: this worker takes no KV transfers).
    fn disagg(&self) -> Option<&PdState> {
        None
    }
}

/// The backend `args` ask for; a prefill or decode worker starts its KV
/// link (and a decode worker its peer pollers and snapshot pusher), its
/// metrics joining `registry`. Call inside the runtime.
pub fn start(engine: &EngineHandle, args: &Args, registry: &prometheus::Registry) -> anyhow::Result<Arc<dyn Backend>> {
    Ok(match args.role {
        Role::Decode => Arc::new(DecodeWorker::new(PdState::start(engine, args, registry)?)),
        Role::Prefill => Arc::new(Local::with_disagg(Role::Prefill, PdState::start(engine, args, registry)?)),
        // A router runs no worker (main.rs); `both` otherwise.
        Role::Both | Role::Router => Arc::new(Local::colocated()),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_route_reason_is_labelled_by_its_decisions_reason_and_no_two_share_a_label() {
        let mut labels = HashSet::new();
        for r in PathReason::ALL {
            assert_eq!(RouteReason::Path(r).as_str(), r.as_str());
            assert!(labels.insert(RouteReason::Path(r).as_str()));
        }
        for r in FallbackReason::ALL {
            assert_eq!(RouteReason::Fallback(r).as_str(), format!("fallback_{}", r.as_str()));
            assert!(labels.insert(RouteReason::Fallback(r).as_str()));
        }
    }
}
