//! The decode worker's backend: a single-choice request goes through
//! [`crate::pd::decode::start`] (local, direct append or remote prefill);
//! several choices or prompts (computed once for all of them) and prompt
//! logprobs (which a remote prefill, returning KV and not logits, cannot
//! give) are computed here, a decision counted and named in `kvc.reason`
//! like the others ([`crate::pd::decode::computed_here`]).

use std::sync::Arc;

use futures::future::BoxFuture;
use kvc_disagg::prefill_path::PathReason;
use kvc_engine::GenerateRequest;

use super::local::submit_here;
use super::{Backend, Serving, Started, Submission};
use crate::args::Role;
use crate::error::ApiError;
use crate::pd::PdState;
use crate::prompt_route::{Route, RouteReason};

pub struct DecodeWorker {
    pd: Arc<PdState>,
}

impl DecodeWorker {
    pub fn new(pd: Arc<PdState>) -> Self {
        Self { pd }
    }
}

/// Why a request must be computed here (None: one sequence that may go to
/// a prefill worker).
pub fn local_only(subs: &[Submission]) -> Option<PathReason> {
    if subs.iter().any(|s| s.sampling.prompt_logprobs.is_some()) {
        // A remote prefill returns the prompt's KV, not its logits.
        Some(PathReason::PromptLogprobs)
    } else if subs.iter().map(|s| s.n).sum::<usize>() > 1 {
        Some(PathReason::MultipleChoices)
    } else {
        None
    }
}

impl Backend for DecodeWorker {
    fn role(&self) -> Role {
        Role::Decode
    }

    fn submit<'a>(&'a self, serving: Serving<'a>, request_id: &'a str, subs: &'a [Submission]) -> BoxFuture<'a, Result<Started, ApiError>> {
        Box::pin(async move {
            let pd = &*self.pd;
            match (local_only(subs), subs) {
                (None, [s]) => {
                    let req = GenerateRequest {
                        request_id: request_id.to_string(),
                        prompt_tokens: s.prompt_tokens.clone(),
                        sampling: s.sampling.clone(),
                        session_id: s.session_id.clone(),
                        cache_salt: s.cache_salt.clone(),
                        grammar: s.grammar.clone(),
                    };
                    let (stream, route) = crate::pd::decode::start(serving.engine, pd, req).await.map_err(|e| match e {
                        ApiError::Engine { source, .. } => (s.map_err)(source),
                        other => other,
                    })?;
                    tracing::info!(
                        request_id,
                        seq_id = stream.id(),
                        prompt_tokens = s.prompt_tokens.len(),
                        path = route.path.as_str(),
                        reason = route.reason.map_or("", RouteReason::as_str),
                        "request submitted"
                    );
                    Ok(Started { streams: vec![stream], route })
                }
                (Some(reason), _) => {
                    let choices = subs.iter().map(|s| s.n).sum();
                    let prompt_tokens = subs.iter().map(|s| s.prompt_tokens.len()).sum();
                    let route = crate::pd::decode::computed_here(request_id, reason, choices, prompt_tokens);
                    Ok(Started { streams: submit_here(serving, request_id, subs)?, route })
                }
                // No prompt at all: nothing to decide.
                (None, _) => Ok(Started { streams: submit_here(serving, request_id, subs)?, route: Route::default() }),
            }
        })
    }

    fn disagg(&self) -> Option<&PdState> {
        Some(&self.pd)
    }
}
