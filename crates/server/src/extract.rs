//! Request bodies: JSON whose every failure (syntax, types, missing
//! fields, size, invalid UTF-8, nesting deeper than serde_json's recursion
//! limit of 128) becomes an OpenAI error instead of axum's plain-text
//! rejection (or a stack overflow).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::{BodyLimit, MAX_BODY_BYTES};

/// A request body type. Bodies that share fields (the sampling fields of
/// chat and completions) read them in a second pass over the same bytes
/// instead of `#[serde(flatten)]`, which would hide the field name from
/// type errors.
pub trait JsonBody: Sized {
    fn parse(bytes: &[u8]) -> Result<Self, ApiError>;
}

/// Deserializes `bytes`; errors name the offending field's path
/// (`messages[0].role: unknown variant ...`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    Json::<T>::from_bytes(bytes).map(|Json(v)| v).map_err(|r| {
        let text = r.body_text();
        let param = match &r {
            JsonRejection::JsonDataError(_) => top_level_field(&text),
            _ => None,
        };
        ApiError::BadRequest { message: text, param }
    })
}

/// The top-level field in a data error's path: `messages` for
/// "...target type: messages[0].role: unknown variant ...".
fn top_level_field(text: &str) -> Option<String> {
    let detail = text.split_once("target type: ")?.1;
    let (path, _) = detail.split_once(": ")?;
    if path.contains(' ') {
        return None; // no path: the message starts right away
    }
    let field = path.split(['.', '[']).next()?;
    (!field.is_empty()).then(|| field.to_string())
}

/// Extractor for a [`JsonBody`]. The content type is not checked (clients
/// such as curl often omit it).
pub struct OpenAiJson<T>(pub T);

/// Bodies larger than this are parsed on the blocking pool: a 16 MiB body
/// takes tens of milliseconds to parse, which would hold up every task of
/// the runtime thread it runs on (`/health` included).
const PARSE_INLINE_BYTES: usize = 64 << 10;

/// Permits for parses on the blocking pool: half the cores, at least one.
fn large_parses() -> &'static tokio::sync::Semaphore {
    static SEM: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SEM.get_or_init(|| tokio::sync::Semaphore::new((std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).max(1)))
}

impl<S: Send + Sync, T: JsonBody + Send + 'static> FromRequest<S> for OpenAiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .copied()
            .unwrap_or(BodyLimit { bytes: MAX_BODY_BYTES, read_timeout: Duration::from_secs(30) });
        let bytes = read_body(req, limit).await?;
        if bytes.len() <= PARSE_INLINE_BYTES {
            return T::parse(&bytes).map(OpenAiJson);
        }
        // Large parses one at a time per two cores: eight 8 MB bodies at
        // once would otherwise take every core from the runtime's threads.
        let _permit = large_parses().acquire().await.map_err(|e| ApiError::Internal(e.to_string()))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("kvc-parse".into())
            .spawn(move || {
                lower_this_threads_priority();
                let _ = tx.send(T::parse(&bytes));
            })
            .map_err(|e| ApiError::Internal(format!("parsing the request body failed: {e}")))?;
        rx.await.map_err(|e| ApiError::Internal(format!("parsing the request body failed: {e}")))?.map(OpenAiJson)
    }
}

/// A large body is parsed on a thread of its own at a lower priority (nice
/// +10), so that where cores are few the runtime's threads (`/health`,
/// streams in flight) still get them first. A thread of its own because a
/// thread cannot raise its priority back without privileges, and the
/// blocking pool's threads are reused.
fn lower_this_threads_priority() {
    // SAFETY: setpriority on the calling thread's own id (Linux keeps nice
    // values per thread); no memory is passed.
    #[cfg(target_os = "linux")]
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// A request's body within `limit`: 413 at once when the declared length
/// is over it (nothing is read), or when the body turns out to be; 408 when
/// it does not arrive within the read timeout.
pub async fn read_body(req: Request, limit: BodyLimit) -> Result<Bytes, ApiError> {
    let declared = req.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit.bytes as u64) {
        return Err(ApiError::PayloadTooLarge { limit: limit.bytes });
    }
    let read = tokio::time::timeout(limit.read_timeout, Bytes::from_request(req, &()))
        .await
        .map_err(|_| ApiError::BodyTimeout { timeout_s: limit.read_timeout.as_secs_f64() })?;
    read.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit: limit.bytes }
        } else {
            ApiError::bad_request(r.body_text(), None)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;
    use crate::openai_types::{ChatCompletionRequest, CompletionRequest};
    use axum::body::Body;

    async fn extract<T: JsonBody + Send + 'static>(body: impl Into<Body>) -> Result<T, ApiError> {
        let req = Request::builder().method("POST").uri("/v1/x").body(body.into()).unwrap();
        OpenAiJson::<T>::from_request(req, &()).await.map(|OpenAiJson(v)| v)
    }

    fn status_and_message(err: ApiError) -> (u16, String) {
        let (status, body) = error_response(&err);
        (status.as_u16(), body.error.message)
    }

    #[tokio::test]
    async fn body_is_parsed_without_a_content_type() {
        let req: ChatCompletionRequest = extract(r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}"#).await.unwrap();
        assert_eq!(req.messages.len(), 1);
        assert_eq!(req.sampling.temperature, Some(0.5));
        let req: CompletionRequest = extract(r#"{"prompt": "x", "max_tokens": 3}"#).await.unwrap();
        assert_eq!(req.sampling.max_tokens, Some(3));
    }

    #[tokio::test]
    async fn malformed_json_is_a_400_openai_error() {
        let (status, msg) = status_and_message(extract::<ChatCompletionRequest>(r#"{"messages": ["#).await.unwrap_err());
        assert_eq!(status, 400);
        assert!(msg.contains("parse"), "{msg}");
        let (status, _) = status_and_message(extract::<ChatCompletionRequest>("").await.unwrap_err());
        assert_eq!(status, 400);
    }

    #[tokio::test]
    async fn type_errors_name_the_field() {
        let cases = [
            (r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#, "temperature"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": "two"}"#, "n"),
            (r#"{"messages": [{"role": "user", "content": 5}]}"#, "messages[0].content"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stop": 5}"#, "stop"),
            (r#"{"model": "m"}"#, "messages"),
        ];
        for (body, field) in cases {
            let err = extract::<ChatCompletionRequest>(body).await.unwrap_err();
            let (status, detail) = error_response(&err);
            assert_eq!(status.as_u16(), 400);
            assert!(detail.error.message.contains(field), "{field} not named in {}", detail.error.message);
            if field != "messages" || body.contains("content") {
                let top = field.split(['.', '[']).next().unwrap();
                assert_eq!(detail.error.param.as_deref(), Some(top), "{}", detail.error.message);
            }
        }
        let (_, msg) = status_and_message(extract::<CompletionRequest>(r#"{"prompt": "x", "top_p": []}"#).await.unwrap_err());
        assert!(msg.contains("top_p"), "{msg}");
    }

    #[test]
    fn deeply_nested_json_is_a_400_not_a_stack_overflow() {
        // 100k nested arrays where any JSON value is allowed (`tools`), in
        // an unknown field (skipped by the parser), and where a typed value
        // is expected (`messages`). Run on a small stack to prove the depth
        // is bounded by the parser, not by luck with the stack size.
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let bodies = [
            format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], "tools": {}}}"#, nest(100_000)),
            format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], "junk": {}}}"#, nest(100_000)),
            format!(r#"{{"messages": {}}}"#, nest(100_000)),
        ];
        for (i, body) in bodies.into_iter().enumerate() {
            let handle = std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    // The parser itself (the extractor runs a body this large
                    // on the blocking pool, whose stacks are larger).
                    ChatCompletionRequest::parse(body.as_bytes()).map(|_| ()).map_err(status_and_message)
                })
                .unwrap();
            let (status, msg) = handle.join().expect("no stack overflow").unwrap_err();
            assert_eq!(status, 400, "body {i}: {msg}");
            if i == 0 {
                assert!(msg.contains("recursion limit"), "{msg}");
            }
        }
    }

    #[tokio::test]
    async fn invalid_utf8_and_lone_surrogates_are_400() {
        let mut body = br#"{"messages": [{"role": "user", "content": ""#.to_vec();
        body.extend_from_slice(&[0xff, 0xfe]);
        body.extend_from_slice(br#""}]}"#);
        assert_eq!(status_and_message(extract::<ChatCompletionRequest>(body).await.unwrap_err()).0, 400);
        let surrogate = r#"{"messages": [{"role": "user", "content": "\ud800"}]}"#;
        assert_eq!(status_and_message(extract::<ChatCompletionRequest>(surrogate).await.unwrap_err()).0, 400);
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_413() {
        // Without the router's DefaultBodyLimit layer axum's default (2 MB) applies.
        let big = vec![b' '; 3 << 20];
        let (status, _) = status_and_message(extract::<ChatCompletionRequest>(big).await.unwrap_err());
        assert_eq!(status, 413);
    }
}
