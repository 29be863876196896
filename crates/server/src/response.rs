//! Answering chat and completions through their [`Endpoint`]: a stream
//! sends every delta as a chunk ([`crate::sse`]); a whole answer folds the
//! same deltas ([`collect`]), so both always say the same thing; [`respond`]
//! answers either way.

use axum::response::{IntoResponse, Response};
use axum::Json;
use kvc_engine::Usage;

use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::generate::{log_finished, serving_headers, ChoiceEvent, Generation};
use crate::sampling::SamplingPlan;
use crate::sse::stream_response;
use crate::state::AppState;

/// The answer to a request: its chunks as a stream when it asked for one,
/// else the whole body with the serving headers.
pub async fn respond<E: Endpoint>(
    state: &AppState,
    generation: Generation,
    endpoint: E,
    sampling: &SamplingPlan,
) -> Result<Response, ApiError> {
    if sampling.stream {
        return Ok(stream_response(state, generation, endpoint, sampling.include_usage));
    }
    let request_id = generation.request_id().to_string();
    let path = generation.path();
    let body = collect(generation, endpoint).await?;
    Ok((serving_headers(&request_id, path), Json(body)).into_response())
}

/// Reads every choice to its end and builds the whole answer. Dropping this
/// future (client gone) drops the generation, which cancels it.
pub async fn collect<E: Endpoint>(mut generation: Generation, mut endpoint: E) -> Result<E::Body, ApiError> {
    let n = generation.n();
    let mut deltas: Vec<Vec<E::Delta>> = (0..n).map(|i| endpoint.start(i)).collect();
    let mut usages = vec![Usage::default(); n];
    while let Some(event) = generation.next().await? {
        match event {
            ChoiceEvent::PromptLogprobs { index, logprobs } => {
                deltas[index].extend(endpoint.prompt_logprobs(index, &logprobs));
            }
            ChoiceEvent::Token { index, token_id, text, logprobs } => {
                deltas[index].extend(endpoint.token(index, token_id, &text, logprobs.as_ref()));
            }
            ChoiceEvent::Finished { index, reason, text, matched_stop, usage } => {
                let (last, reported) = endpoint.finish(index, &text, reason, matched_stop);
                deltas[index].extend(last);
                usages[index] = usage;
                generation.record_finish(reported);
                log_finished(generation.request_id(), index, reported, &usage);
            }
        }
    }
    Ok(endpoint.body(deltas, generation.total_usage(&usages)))
}
