//! The server's one error type and the one function that turns any error
//! into an HTTP status plus OpenAI's error JSON:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvc_engine::EngineError;
use serde::Serialize;

/// What a 429 or 503 suggests in `Retry-After`, in seconds (a full queue,
/// no healthy worker, draining).
pub const RETRY_AFTER_S: u64 = 1;

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or a parameter is out of range (400).
    #[error("{message}")]
    BadRequest { message: String, param: Option<String> },
    /// A schema or grammar whose text is over what this server compiles
    /// (400, code `grammar_too_large`; `param` the field it came from).
    #[error("{message}")]
    GrammarTooLarge { message: String, param: &'static str },
    /// A feature the API defines but kvc does not implement yet (400).
    #[error("{feature} is not supported yet")]
    Unsupported { feature: String, param: Option<String> },
    /// The `model` field names a model this server does not serve (404).
    #[error("The model `{model}` does not exist.")]
    ModelNotFound { model: String },
    /// No session with this id on this worker (404).
    #[error("session `{id}` does not exist")]
    SessionNotFound { id: String },
    /// No route for this path (404).
    #[error("no route for {method} {path}")]
    NoRoute { method: String, path: String },
    /// The path exists but not for this method (405).
    #[error("method {method} is not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The body is larger than the configured limit (413).
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The body did not arrive within `--body-read-timeout-s` (408).
    #[error("the request body did not arrive within {timeout_s} s (--body-read-timeout-s)")]
    BodyTimeout { timeout_s: f64 },
    /// An error from the engine. `prompt_param` is how the endpoint names its
    /// prompt (`messages` for chat, `prompt` for completions), used for
    /// prompt-related engine errors.
    #[error("{source}")]
    Engine { source: EngineError, prompt_param: &'static str },
    /// No or a wrong API key / cluster token (401). `code` says which.
    #[error("{message}")]
    Unauthorized { message: String, code: &'static str },
    /// The endpoint is switched off in this process (403).
    #[error("{0}")]
    Forbidden(String),
    /// Every concurrency slot and queue place is taken (429).
    #[error("the server is at capacity ({running} requests running, {queued} queued); retry after {retry_after_s} s")]
    Busy { running: usize, queued: usize, retry_after_s: u64 },
    /// The prompt would wait longer than `--max-queue-delay-s` behind the
    /// prefill already queued (429; `kvc_policy::queue_delay`).
    #[error("the server's prefill queue would delay this request about {wait_s:.1} s, over --max-queue-delay-s {bound_s} s; retry after {retry_after_s} s")]
    QueueDelay { wait_s: f64, bound_s: f64, retry_after_s: u64 },
    /// The prompt has more tokens than `--max-prompt-tokens` allows (400).
    /// `qualifier` is "" for a counted prompt and "at least " for one
    /// refused before tokenizing, by a bound from its size.
    #[error("the prompt has {qualifier}{tokens} tokens, more than this server accepts ({limit}, --max-prompt-tokens)")]
    PromptTooLarge { tokens: usize, limit: usize, param: &'static str, qualifier: &'static str },
    /// `--request-timeout-s` passed before the answer was complete (504);
    /// the engine request was cancelled.
    #[error("the request did not complete within the server's timeout of {timeout_s} s; it was cancelled")]
    Timeout { timeout_s: u64 },
    /// Draining for shutdown, or the engine is gone (503).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected failure on our side (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError::BadRequest { message: message.into(), param: param.map(str::to_string) }
    }

    pub fn unsupported(feature: impl Into<String>, param: &str) -> Self {
        ApiError::Unsupported { feature: feature.into(), param: Some(param.to_string()) }
    }

    /// An engine error, or a text front's (tokenizer, chat template) as the
    /// engine converts it.
    pub fn chat_engine(source: impl Into<EngineError>) -> Self {
        ApiError::Engine { source: source.into(), prompt_param: "messages" }
    }

    pub fn completion_engine(source: impl Into<EngineError>) -> Self {
        ApiError::Engine { source: source.into(), prompt_param: "prompt" }
    }
}

/// The `error` object of OpenAI's error response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The one mapping from errors to HTTP status and OpenAI error JSON.
///
/// Types follow OpenAI: `invalid_request_error` for 4xx (the `openai`
/// client raises `BadRequestError` for 400 and `NotFoundError` for 404
/// whatever the type), `internal_server_error` for 500 and
/// `service_unavailable_error` for 503.
pub fn error_response(err: &ApiError) -> (StatusCode, ErrorBody) {
    let message = err.to_string();
    let invalid =
        |status: StatusCode, param: Option<String>, code: Option<&str>| (status, "invalid_request_error", param, code.map(str::to_string));
    let (status, kind, param, code) = match err {
        ApiError::BadRequest { param, .. } => invalid(StatusCode::BAD_REQUEST, param.clone(), None),
        ApiError::GrammarTooLarge { param, .. } => invalid(StatusCode::BAD_REQUEST, Some(param.to_string()), Some("grammar_too_large")),
        ApiError::Unsupported { param, .. } => invalid(StatusCode::BAD_REQUEST, param.clone(), Some("unsupported_parameter")),
        ApiError::ModelNotFound { .. } => invalid(StatusCode::NOT_FOUND, Some("model".into()), Some("model_not_found")),
        ApiError::SessionNotFound { .. } => invalid(StatusCode::NOT_FOUND, None, Some("session_not_found")),
        ApiError::NoRoute { .. } => invalid(StatusCode::NOT_FOUND, None, Some("unknown_url")),
        ApiError::MethodNotAllowed { .. } => invalid(StatusCode::METHOD_NOT_ALLOWED, None, Some("method_not_allowed")),
        ApiError::PayloadTooLarge { .. } => invalid(StatusCode::PAYLOAD_TOO_LARGE, None, Some("request_too_large")),
        ApiError::BodyTimeout { .. } => invalid(StatusCode::REQUEST_TIMEOUT, None, Some("request_body_timeout")),
        ApiError::Engine { source, prompt_param } if source.is_client_error() => {
            let param = source.param().map(|p| if p == "messages" { *prompt_param } else { p });
            let code = match source {
                EngineError::PromptTooLong { .. } => Some("context_length_exceeded"),
                EngineError::TokenOutOfRange { .. } => Some("invalid_token_id"),
                _ => None,
            };
            invalid(StatusCode::BAD_REQUEST, param.map(str::to_string), code)
        }
        ApiError::Unauthorized { code, .. } => invalid(StatusCode::UNAUTHORIZED, None, Some(*code)),
        ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "permission_error", None, Some("forbidden".into())),
        ApiError::Busy { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", None, Some("server_busy".into())),
        ApiError::QueueDelay { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", None, Some("queue_delay_exceeded".into())),
        ApiError::PromptTooLarge { param, .. } => {
            invalid(StatusCode::BAD_REQUEST, Some(param.to_string()), Some("context_length_exceeded"))
        }
        ApiError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "timeout_error", None, Some("request_timeout".into())),
        ApiError::Engine { source: EngineError::ShuttingDown, .. } | ApiError::Unavailable(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error", None, None)
        }
        ApiError::Engine { .. } | ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_server_error", None, None),
    };
    let body = ErrorBody { error: ErrorDetail { message, kind: kind.to_string(), param, code } };
    (status, body)
}

/// Headers that go with some errors: `WWW-Authenticate` on 401 (RFC 6750),
/// `Retry-After` on 429 and 503 (no healthy worker, draining: clients and
/// load balancers back off instead of hammering), and `x-should-retry: false` on a timeout (the
/// `openai` client would otherwise retry work that just took too long).
pub fn error_headers(err: &ApiError) -> Vec<(HeaderName, HeaderValue)> {
    match err {
        ApiError::Unauthorized { .. } => {
            vec![(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))]
        }
        ApiError::Busy { retry_after_s, .. } | ApiError::QueueDelay { retry_after_s, .. } => {
            vec![(header::RETRY_AFTER, HeaderValue::from(*retry_after_s))]
        }
        ApiError::Timeout { .. } => vec![(HeaderName::from_static("x-should-retry"), HeaderValue::from_static("false"))],
        // The rest of the body is not read: the connection cannot be reused.
        ApiError::PayloadTooLarge { .. } | ApiError::BodyTimeout { .. } => vec![(header::CONNECTION, HeaderValue::from_static("close"))],
        ApiError::Unavailable(_) | ApiError::Engine { source: EngineError::ShuttingDown, .. } => {
            vec![(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S))]
        }
        _ => Vec::new(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = error_response(&self);
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::info!(status = status.as_u16(), error = %self, "request rejected");
        }
        let mut response = (status, Json(body)).into_response();
        response.headers_mut().extend(error_headers(&self));
        response
    }
}

/// A refusal's HTTP status and the `param` its error JSON names (the
/// request-parsing tests' one check).
#[cfg(test)]
pub(crate) fn status_and_param(err: ApiError) -> (u16, Option<String>) {
    let (status, body) = error_response(&err);
    (status.as_u16(), body.error.param)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(err: ApiError) -> (u16, ErrorDetail) {
        let (status, body) = error_response(&err);
        (status.as_u16(), body.error)
    }

    #[test]
    fn a_stalled_body_is_408_and_closes_the_connection() {
        let err = ApiError::BodyTimeout { timeout_s: 30.0 };
        let (status, e) = map(err);
        assert_eq!((status, e.kind.as_str(), e.code.as_deref()), (408, "invalid_request_error", Some("request_body_timeout")));
        assert!(error_headers(&ApiError::BodyTimeout { timeout_s: 1.0 }).contains(&(header::CONNECTION, HeaderValue::from_static("close"))));
    }

    #[test]
    fn bad_request_is_400_invalid_request_error_with_param() {
        let (status, e) = map(ApiError::bad_request("n must be 1", Some("n")));
        assert_eq!(status, 400);
        assert_eq!(e.kind, "invalid_request_error");
        assert_eq!(e.param.as_deref(), Some("n"));
        assert_eq!(e.message, "n must be 1");
    }

    #[test]
    fn unsupported_feature_is_400_and_says_not_supported_yet() {
        let (status, e) = map(ApiError::unsupported("logprobs", "logprobs"));
        assert_eq!(status, 400);
        assert!(e.message.contains("not supported yet"), "{}", e.message);
        assert_eq!(e.code.as_deref(), Some("unsupported_parameter"));
    }

    #[test]
    fn unknown_model_is_404_model_not_found() {
        let (status, e) = map(ApiError::ModelNotFound { model: "gpt-4".into() });
        assert_eq!(status, 404);
        assert_eq!(e.code.as_deref(), Some("model_not_found"));
        assert!(e.message.contains("gpt-4"));
    }

    #[test]
    fn oversized_body_is_413() {
        assert_eq!(map(ApiError::PayloadTooLarge { limit: 10 }).0, 413);
    }

    #[test]
    fn engine_client_errors_are_400_with_endpoint_prompt_param() {
        let too_long = || EngineError::PromptTooLong { prompt_tokens: 10, max_tokens: 5, requested: 15, max_model_len: 12 };
        let (status, e) = map(ApiError::chat_engine(too_long()));
        assert_eq!(status, 400);
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert!(e.message.contains("maximum context length"));
        let (_, e) = map(ApiError::completion_engine(too_long()));
        assert_eq!(e.param.as_deref(), Some("prompt"));

        let (status, e) = map(ApiError::completion_engine(EngineError::TokenOutOfRange { token: 9, vocab_size: 5 }));
        assert_eq!(status, 400);
        assert_eq!(e.param.as_deref(), Some("prompt"));

        let invalid = EngineError::InvalidParam { param: "top_p".into(), message: "top_p must be in (0, 1]".into() };
        let (status, e) = map(ApiError::chat_engine(invalid));
        assert_eq!(status, 400);
        assert_eq!(e.param.as_deref(), Some("top_p"));
    }

    #[test]
    fn engine_server_errors_are_5xx() {
        let (status, e) = map(ApiError::chat_engine(EngineError::Model("boom".into())));
        assert_eq!(status, 500);
        assert_eq!(e.kind, "internal_server_error");
        assert_eq!(map(ApiError::chat_engine(EngineError::ShuttingDown)).0, 503);
        assert_eq!(map(ApiError::Internal("x".into())).0, 500);
    }

    #[test]
    fn auth_capacity_and_timeout_errors_have_their_status_and_headers() {
        let unauthorized = ApiError::Unauthorized { message: "no key".into(), code: "invalid_api_key" };
        let (status, e) = map(ApiError::Unauthorized { message: "no key".into(), code: "invalid_api_key" });
        assert_eq!((status, e.code.as_deref()), (401, Some("invalid_api_key")));
        assert_eq!(error_headers(&unauthorized)[0].0, header::WWW_AUTHENTICATE);

        let busy = ApiError::Busy { running: 4, queued: 8, retry_after_s: 2 };
        assert_eq!(map(ApiError::Busy { running: 4, queued: 8, retry_after_s: 2 }).0, 429);
        assert_eq!(error_headers(&busy), vec![(header::RETRY_AFTER, HeaderValue::from(2u64))]);

        let timeout = ApiError::Timeout { timeout_s: 5 };
        assert_eq!(map(ApiError::Timeout { timeout_s: 5 }).0, 504);
        assert_eq!(error_headers(&timeout)[0].1, "false");

        assert_eq!(map(ApiError::Forbidden("off".into())).0, 403);
        assert_eq!(map(ApiError::Unavailable("draining".into())).0, 503);
        let unavailable = ApiError::Unavailable("no healthy worker".into());
        assert_eq!(error_headers(&unavailable), vec![(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S))]);
        let (status, e) = map(ApiError::PromptTooLarge { tokens: 9, limit: 4, param: "prompt", qualifier: "" });
        assert!(e.message.starts_with("the prompt has 9 tokens"), "{}", e.message);
        // Refused by its size before tokenizing: a lower bound, said so.
        let bound = map(ApiError::PromptTooLarge { tokens: 9, limit: 4, param: "prompt", qualifier: "at least " }).1;
        assert!(bound.message.starts_with("the prompt has at least 9 tokens"), "{}", bound.message);
        assert_eq!((status, e.param.as_deref(), e.code.as_deref()), (400, Some("prompt"), Some("context_length_exceeded")));
    }

    #[test]
    fn error_json_has_openai_shape() {
        let (_, body) = error_response(&ApiError::bad_request("bad", None));
        let v = serde_json::to_value(body).unwrap();
        let e = &v["error"];
        for key in ["message", "type", "param", "code"] {
            assert!(e.get(key).is_some(), "missing {key} in {v}");
        }
        assert!(e["param"].is_null());
    }
}
