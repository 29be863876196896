//! Server-sent events for streaming responses.
//!
//! The SSE body owns the engine's [`RequestStream`]: when the client goes
//! away, axum drops the body, the stream is dropped with it, and the engine
//! cancels the request and frees its blocks.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use kvc_engine::{FinishReason, MatchedStop, RequestStream, StreamEvent, Usage};
use serde::Serialize;

use crate::app::{AppState, ServerCounters};
use crate::error::{error_response, ApiError};
use crate::generate::{log_finished, serving_headers};

/// How one endpoint spells its chunks (chat vs completions). Each method
/// returns a chunk ready to serialize.
pub trait ChunkFormat: Send + 'static {
    type Chunk: Serialize;
    /// Sent before any token (chat's role chunk).
    fn opening(&self) -> Option<Self::Chunk>;
    /// A piece of generated text (never empty).
    fn text(&self, text: String) -> Self::Chunk;
    /// The chunk carrying `finish_reason`.
    fn finish(&self, reason: FinishReason, stop: Option<MatchedStop>, usage: &Usage) -> Self::Chunk;
    /// The final `choices: []` chunk with usage (only with `include_usage`).
    fn usage(&self, usage: &Usage) -> Self::Chunk;
}

/// Turns the engine's events for one request into SSE data lines.
struct Driver<F: ChunkFormat> {
    events: Option<RequestStream>,
    format: F,
    include_usage: bool,
    queue: VecDeque<String>,
    finished: bool,
    request_id: String,
    state: AppState,
}

impl<F: ChunkFormat> Driver<F> {
    fn push<T: Serialize>(&mut self, chunk: &T) {
        match serde_json::to_string(chunk) {
            Ok(s) => self.queue.push_back(s),
            Err(e) => self.fail(format!("cannot serialize a chunk: {e}")),
        }
    }

    fn end(&mut self) {
        self.queue.push_back("[DONE]".to_string());
        self.finished = true;
        self.events = None;
    }

    fn fail(&mut self, message: String) {
        let err = ApiError::Internal(message);
        tracing::error!(request_id = %self.request_id, error = %err, "stream failed");
        let (_, body) = error_response(&err);
        self.queue.push_back(serde_json::to_string(&body).unwrap_or_default());
        self.end();
    }

    fn on_event(&mut self, event: Option<StreamEvent>) {
        match event {
            Some(StreamEvent::Token { text, .. }) => {
                if !text.is_empty() {
                    let chunk = self.format.text(text);
                    self.push(&chunk);
                }
            }
            Some(StreamEvent::Finished { reason, text, matched_stop, usage }) => {
                if !text.is_empty() {
                    let chunk = self.format.text(text);
                    self.push(&chunk);
                }
                let chunk = self.format.finish(reason, matched_stop, &usage);
                self.push(&chunk);
                if self.include_usage {
                    let chunk = self.format.usage(&usage);
                    self.push(&chunk);
                }
                log_finished(&self.request_id, reason, &usage);
                self.end();
            }
            Some(StreamEvent::Error(msg)) => self.fail(format!("generation failed: {msg}")),
            None => self.fail("the engine ended the request without a result".into()),
        }
    }
}

impl<F: ChunkFormat> Drop for Driver<F> {
    fn drop(&mut self) {
        if !self.finished {
            ServerCounters::inc(&self.state.counters.streams_cancelled);
            tracing::info!(request_id = %self.request_id, "stream dropped before the end (client gone or shutdown); request cancelled");
        }
    }
}

/// The streaming response: `data: {chunk}` lines, then `data: [DONE]`.
pub fn stream_response<F: ChunkFormat>(
    state: &AppState,
    request_id: &str,
    events: RequestStream,
    format: F,
    include_usage: bool,
) -> Response {
    let mut driver = Driver {
        events: Some(events),
        format,
        include_usage,
        queue: VecDeque::new(),
        finished: false,
        request_id: request_id.to_string(),
        state: state.clone(),
    };
    if let Some(chunk) = driver.format.opening() {
        driver.push(&chunk);
    }
    let body = futures::stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(data) = d.queue.pop_front() {
                return Some((Ok::<Event, Infallible>(Event::default().data(data)), d));
            }
            if d.finished {
                return None;
            }
            let event = match d.events.as_mut() {
                Some(rx) => rx.recv().await,
                None => None,
            };
            d.on_event(event);
        }
    });
    (serving_headers(request_id), Sse::new(body).keep_alive(KeepAlive::default())).into_response()
}
