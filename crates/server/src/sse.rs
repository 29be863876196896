//! Server-sent events for streaming responses.
//!
//! The SSE body owns the [`Generation`]: when the client goes away, axum
//! drops the body, the generation is dropped with it, and the engine
//! cancels its sequences and frees their blocks. A request that fails
//! mid-stream (timeout, shutdown, engine error) ends with one
//! `data: {"error": {...}}` event (the `openai` client raises it as an
//! `APIError`) and `data: [DONE]`.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use kvc_engine::Usage;

use crate::endpoint::Endpoint;
use crate::error::{error_response, ApiError};
use crate::generate::{log_finished, serving_headers, ChoiceEvent, Generation};
use crate::openai_types::{ChunkUsage, KvcInfo, UsageInfo};
use crate::state::AppState;

/// Which chunks of a stream carry `usage` (`stream_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamUsage {
    /// None (no `include_usage`).
    #[default]
    Off,
    /// A last chunk with the totals; every other chunk says `null`
    /// (`include_usage`).
    Final,
    /// That last chunk, and every other chunk with the prompt and the
    /// completion tokens so far (vLLM's `continuous_usage_stats`).
    Continuous,
}

/// Turns a generation's events into SSE data lines.
struct Driver<E: Endpoint> {
    generation: Generation,
    endpoint: E,
    include_usage: StreamUsage,
    usages: Vec<Usage>,
    /// Tokens generated so far, by choice (for [`StreamUsage::Continuous`]).
    generated: Vec<usize>,
    queue: VecDeque<String>,
    finished: bool,
    state: AppState,
}

impl<E: Endpoint> Driver<E> {
    fn chunk_usage(&self) -> ChunkUsage {
        match self.include_usage {
            StreamUsage::Off => None,
            StreamUsage::Final => Some(None),
            StreamUsage::Continuous => {
                let (prompt, completion) = (self.generation.prompt_len(), self.generated.iter().sum::<usize>());
                Some(Some(UsageInfo {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    total_tokens: prompt + completion,
                    prompt_tokens_details: None,
                }))
            }
        }
    }

    fn push(&mut self, deltas: Vec<E::Delta>, kvc: Option<KvcInfo>) {
        let chunk = self.endpoint.chunk(deltas, self.chunk_usage(), kvc);
        match serde_json::to_string(&chunk) {
            Ok(s) => self.queue.push_back(s),
            Err(e) => self.fail(ApiError::Internal(format!("cannot serialize a chunk: {e}"))),
        }
    }

    fn end(&mut self) {
        self.queue.push_back("[DONE]".to_string());
        self.finished = true;
    }

    fn fail(&mut self, err: ApiError) {
        let (_, body) = error_response(&err);
        self.queue.push_back(serde_json::to_string(&body).unwrap_or_default());
        self.end();
    }

    fn on_event(&mut self, event: Result<Option<ChoiceEvent>, ApiError>) {
        match event {
            Ok(Some(ChoiceEvent::PromptLogprobs { index, logprobs })) => {
                for delta in self.endpoint.prompt_logprobs(index, &logprobs) {
                    self.push(vec![delta], None);
                }
            }
            Ok(Some(ChoiceEvent::Token { index, token_id, text, logprobs })) => {
                self.generated[index] += 1;
                if let Some(delta) = self.endpoint.token(index, token_id, &text, logprobs.as_ref()) {
                    self.push(vec![delta], None);
                }
            }
            Ok(Some(ChoiceEvent::Finished { index, reason, text, matched_stop, usage })) => {
                self.generated[index] = usage.completion_tokens;
                let (deltas, reported) = self.endpoint.finish(index, &text, reason, matched_stop);
                let last = deltas.len().saturating_sub(1);
                for (i, delta) in deltas.into_iter().enumerate() {
                    let kvc = (i == last).then(|| KvcInfo::local(&usage));
                    self.push(vec![delta], kvc);
                }
                self.usages[index] = usage;
                self.generation.record_finish(reported);
                log_finished(self.generation.request_id(), index, reported, &usage);
            }
            Ok(None) => {
                if self.include_usage != StreamUsage::Off {
                    let usage = self.generation.total_usage(&self.usages);
                    let chunk = self.endpoint.chunk(vec![], Some(Some(usage.into())), None);
                    match serde_json::to_string(&chunk) {
                        Ok(s) => self.queue.push_back(s),
                        Err(e) => return self.fail(ApiError::Internal(format!("cannot serialize a chunk: {e}"))),
                    }
                }
                self.end();
            }
            Err(err) => self.fail(err),
        }
    }
}

impl<E: Endpoint> Drop for Driver<E> {
    fn drop(&mut self) {
        if !self.finished {
            self.state.metrics.streams_cancelled.inc();
            tracing::info!(
                request_id = %self.generation.request_id(),
                "stream dropped before the end (client gone or shutdown); request cancelled"
            );
        }
    }
}

/// The streaming response: `data: {chunk}` lines, then `data: [DONE]`.
pub fn stream_response<E: Endpoint>(state: &AppState, generation: Generation, mut endpoint: E, include_usage: StreamUsage) -> Response {
    let request_id = generation.request_id().to_string();
    let path = generation.path();
    let n = generation.n();
    let opening: Vec<Vec<E::Delta>> = (0..n).map(|i| endpoint.start(i)).collect();
    let mut driver = Driver {
        generation,
        endpoint,
        include_usage,
        usages: vec![Usage::default(); n],
        generated: vec![0; n],
        queue: VecDeque::new(),
        finished: false,
        state: state.clone(),
    };
    for deltas in opening {
        for delta in deltas {
            driver.push(vec![delta], None);
        }
    }
    let body = futures::stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(data) = d.queue.pop_front() {
                return Some((Ok::<Event, Infallible>(Event::default().data(data)), d));
            }
            if d.finished {
                return None;
            }
            let event = d.generation.next().await;
            d.on_event(event);
        }
    });
    (serving_headers(&request_id, path), Sse::new(body).keep_alive(KeepAlive::default())).into_response()
}
