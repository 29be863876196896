//! What chat and completions share once the prompt is tokenized: request
//! ids, submission to the engine, collecting a whole answer, and the
//! response headers that say how a request was served.

use axum::http::{HeaderName, HeaderValue};
use kvc_engine::{EngineError, FinishReason, GenerateRequest, MatchedStop, RequestStream, SamplingParams, StreamEvent, Usage};

use crate::app::{AppState, ServerCounters};
use crate::error::ApiError;
use crate::openai_types::PATH_LOCAL;

/// `chatcmpl-<uuid>` / `cmpl-<uuid>`.
pub fn new_request_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Headers on every generation response (DESIGN.md §5).
pub fn serving_headers(request_id: &str) -> [(HeaderName, HeaderValue); 2] {
    let id = HeaderValue::from_str(request_id).unwrap_or_else(|_| HeaderValue::from_static("invalid"));
    [
        (HeaderName::from_static("x-kvc-path"), HeaderValue::from_static(PATH_LOCAL)),
        (HeaderName::from_static("x-request-id"), id),
    ]
}

/// Hands a tokenized request to the engine. `map_err` attaches the
/// endpoint's name for the prompt to engine errors.
pub fn submit(
    state: &AppState,
    request_id: &str,
    prompt_tokens: Vec<u32>,
    sampling: SamplingParams,
    map_err: fn(EngineError) -> ApiError,
) -> Result<RequestStream, ApiError> {
    let (prompt_len, max_tokens) = (prompt_tokens.len(), sampling.max_tokens);
    let req = GenerateRequest { request_id: request_id.to_string(), prompt_tokens, sampling };
    let stream = state.engine.submit(req).map_err(map_err)?;
    ServerCounters::inc(&state.counters.local_requests);
    tracing::info!(request_id, seq_id = stream.id(), prompt_tokens = prompt_len, max_tokens, path = PATH_LOCAL, "request submitted");
    Ok(stream)
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub text: String,
    pub finish_reason: FinishReason,
    pub matched_stop: Option<MatchedStop>,
    pub usage: Usage,
}

/// Reads the stream to its end. Dropping this future (client gone) drops
/// the stream, which cancels the request.
pub async fn collect(request_id: &str, mut stream: RequestStream) -> Result<Outcome, ApiError> {
    let mut text = String::new();
    while let Some(event) = stream.recv().await {
        match event {
            StreamEvent::Token { text: t, .. } => text.push_str(&t),
            StreamEvent::Finished { reason, text: t, matched_stop, usage } => {
                text.push_str(&t);
                log_finished(request_id, reason, &usage);
                return Ok(Outcome { text, finish_reason: reason, matched_stop, usage });
            }
            StreamEvent::Error(msg) => return Err(ApiError::Internal(format!("generation failed: {msg}"))),
        }
    }
    Err(ApiError::Internal("the engine ended the request without a result".into()))
}

pub fn log_finished(request_id: &str, reason: FinishReason, usage: &Usage) {
    tracing::info!(
        request_id,
        finish_reason = reason.as_str(),
        prompt_tokens = usage.prompt_tokens,
        cached_tokens = usage.cached_tokens,
        completion_tokens = usage.completion_tokens,
        "request finished"
    );
}
