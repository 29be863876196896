//! The local backend: every choice is a sequence of this worker's engine,
//! all of a request's sequences in one submission (so they enter the
//! scheduler in the same step and a seeded request reproduces). A `both`
//! worker, and a prefill worker's own `/v1/*` requests.

use std::sync::Arc;

use futures::future::BoxFuture;
use kvc_engine::{EngineError, GenerateRequest, RequestStream};

use super::{Backend, Serving, Started, Submission};
use crate::args::Role;
use crate::error::ApiError;
use crate::pd::PdState;
use crate::prompt_route::Route;

pub struct Local {
    role: Role,
    /// A prefill worker's KV link and counters.
    disagg: Option<Arc<PdState>>,
}

impl Local {
    /// `--role both`.
    pub fn colocated() -> Self {
        Self { role: Role::Both, disagg: None }
    }

    /// A worker that computes its own requests here and takes KV transfers
    /// (`--role prefill`).
    pub fn with_disagg(role: Role, disagg: Arc<PdState>) -> Self {
        Self { role, disagg: Some(disagg) }
    }
}

impl Backend for Local {
    fn role(&self) -> Role {
        self.role
    }

    fn submit<'a>(&'a self, serving: Serving<'a>, request_id: &'a str, subs: &'a [Submission]) -> BoxFuture<'a, Result<Started, ApiError>> {
        Box::pin(async move { Ok(Started { streams: submit_here(serving, request_id, subs)?, route: Route::default() }) })
    }

    fn disagg(&self) -> Option<&PdState> {
        self.disagg.as_deref()
    }
}

/// Submits `n` sequences per prompt with the same prompt (their prompt KV
/// is shared through the engine's prefix cache), after the
/// `--max-queue-delay-s` check. A `seed` becomes `seed + index` per choice,
/// as in vLLM, so seeded choices differ yet reproduce; only the first
/// choice continues the session.
pub fn submit_here(serving: Serving, request_id: &str, subs: &[Submission]) -> Result<Vec<RequestStream>, ApiError> {
    let map_err = subs.first().map_or(ApiError::completion_engine as fn(EngineError) -> ApiError, |s| s.map_err);
    let prompt_of: Vec<usize> = subs.iter().enumerate().flat_map(|(p, s)| std::iter::repeat_n(p, s.n)).collect();
    let total = prompt_of.len();
    let mut reqs: Vec<GenerateRequest> = Vec::new();
    for (p, s) in subs.iter().enumerate() {
        for index in 0..s.n {
            let mut sampling = s.sampling.clone();
            sampling.seed = choice_seed(sampling.seed, index);
            reqs.push(GenerateRequest {
                request_id: if total == 1 { request_id.to_string() } else { format!("{request_id}-{}", reqs.len()) },
                prompt_tokens: s.prompt_tokens.clone(),
                sampling,
                // Only the first choice continues the session; the others are
                // alternatives the client has not chosen yet.
                session_id: if p == 0 && index == 0 { s.session_id.clone() } else { None },
                cache_salt: s.cache_salt.clone(),
                grammar: s.grammar.clone(),
            });
        }
    }
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    crate::queue_delay::check(serving.engine, serving.max_queue_delay_s, request_id)?;
    let group = serving.engine.submit_group(reqs).map_err(map_err)?;
    for (index, stream) in group.iter().enumerate() {
        serving.metrics.local_requests.inc();
        let s = &subs[prompt_of[index]];
        tracing::info!(
            request_id,
            index,
            seq_id = stream.id(),
            prompt_tokens = s.prompt_tokens.len(),
            max_tokens = s.sampling.max_tokens,
            path = kvc_engine::ServePath::Local.as_str(),
            "request submitted"
        );
    }
    Ok(group)
}

/// The seed of choice `index`: `seed + index` (vLLM's rule), so seeded
/// choices differ from each other yet each reproduces.
pub fn choice_seed(seed: Option<u64>, index: usize) -> Option<u64> {
    seed.map(|s| s.wrapping_add(index as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_choices_get_seed_plus_index_and_unseeded_stay_unseeded() {
        assert_eq!((0..3).map(|i| choice_seed(Some(100), i)).collect::<Vec<_>>(), vec![Some(100), Some(101), Some(102)]);
        assert_eq!(choice_seed(Some(u64::MAX), 1), Some(0));
        assert_eq!(choice_seed(None, 2), None);
    }
}
