//! What chat and completions share once a request is validated: request
//! ids, admission, the prompt-length limit, submission of the `n` engine
//! sequences, and reading their events under the request's deadline and
//! the server's shutdown, with the latency metrics taken on the way.

use std::time::Instant;

use axum::http::{HeaderName, HeaderValue};
use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use kvc_engine::{FinishReason, Logprobs, MatchedStop, RequestStream, StreamEvent, Usage};

use crate::backend::{Started, Submission};
use crate::error::ApiError;
use crate::prompt_route::Route;
use crate::request_slots::Slot;
use crate::server_metrics::Finish;
use crate::state::AppState;

/// `chatcmpl-<uuid>` / `cmpl-<uuid>`.
pub fn new_request_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Headers on every generation response: `x-kvc-path` and `x-request-id`.
pub fn serving_headers(request_id: &str, path: kvc_engine::ServePath) -> [(HeaderName, HeaderValue); 2] {
    let id = HeaderValue::from_str(request_id).unwrap_or_else(|_| HeaderValue::from_static("invalid"));
    [(HeaderName::from_static("x-kvc-path"), HeaderValue::from_static(path.as_str())), (HeaderName::from_static("x-request-id"), id)]
}

/// An admitted request: its id, arrival, deadline and concurrency slot.
pub struct Admitted {
    pub request_id: String,
    arrival: Instant,
    deadline: Option<Instant>,
    slot: Slot,
}

/// Takes a concurrency slot for a request that arrived at `arrival`
/// (waiting in the queue if need be, 429 if the queue is full, 504 if the
/// deadline passes first).
pub async fn admit(state: &AppState, arrival: Instant, id_prefix: &str) -> Result<Admitted, ApiError> {
    if state.lifecycle.is_draining() {
        return Err(ApiError::Unavailable("the server is shutting down".into()));
    }
    let deadline = state.config.request_timeout.map(|t| arrival + t);
    let slot = within(state, deadline, state.admission.admit()).await??;
    Ok(Admitted { request_id: new_request_id(id_prefix), arrival, deadline, slot })
}

/// Runs `work` (e.g. tokenization) under the request's deadline.
pub async fn within<T>(state: &AppState, deadline: Option<Instant>, work: impl std::future::Future<Output = T>) -> Result<T, ApiError> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), work).await.map_err(|_| timeout_error(state)),
        None => Ok(work.await),
    }
}

fn timeout_error(state: &AppState) -> ApiError {
    ApiError::Timeout { timeout_s: state.config.request_timeout.map_or(0, |t| t.as_secs()) }
}

impl Admitted {
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

/// Refuses prompts longer than `--max-prompt-tokens`.
pub fn check_prompt_len(state: &AppState, tokens: usize, param: &'static str) -> Result<(), ApiError> {
    let limit = state.max_prompt_tokens();
    if tokens > limit {
        return Err(ApiError::PromptTooLarge { tokens, limit, param, qualifier: "" });
    }
    Ok(())
}

/// A prompt text so long that it cannot fit `--max-prompt-tokens` whatever
/// its tokenization is refused before tokenizing it: a token decodes to at
/// most `MAX_TOKEN_BYTES` bytes (Qwen3: 128), and NFC normalization
/// shrinks text at most 3x. The count it reports is that lower bound,
/// and the message says "at least".
pub fn check_prompt_bytes(state: &AppState, bytes: usize, param: &'static str) -> Result<(), ApiError> {
    const MAX_TOKEN_BYTES: usize = 128;
    let limit = state.max_prompt_tokens();
    if bytes > limit.saturating_mul(MAX_TOKEN_BYTES * 3) {
        return Err(ApiError::PromptTooLarge { tokens: bytes / (MAX_TOKEN_BYTES * 3), limit, param, qualifier: "at least " });
    }
    Ok(())
}

/// Submits `n` sequences with the same prompt through the worker's
/// backend ([`crate::backend::Backend::submit`]: on a `both` worker all
/// of them here, on a decode worker a single choice perhaps through a
/// prefill worker).
pub async fn submit(state: &AppState, admitted: Admitted, s: Submission) -> Result<Generation, ApiError> {
    submit_prompts(state, admitted, vec![s]).await
}

/// [`submit`] for several prompts (a completions batch), all sequences in
/// one submission: prompt `p`'s choice `i` is choice
/// `sum(n of the prompts before p) + i` of the generation.
pub async fn submit_prompts(state: &AppState, admitted: Admitted, subs: Vec<Submission>) -> Result<Generation, ApiError> {
    let Admitted { request_id, arrival, deadline, slot } = admitted;
    let prompt_lens: Vec<usize> = subs.iter().map(|s| s.prompt_tokens.len()).collect();
    let prompt_of: Vec<usize> = subs.iter().enumerate().flat_map(|(p, s)| std::iter::repeat_n(p, s.n)).collect();
    let total = prompt_of.len();
    let Started { streams: started, route } = within(state, deadline, state.backend.submit(state.serving(), &request_id, &subs)).await??;
    let mut streams = SelectAll::new();
    for (index, stream) in started.into_iter().enumerate() {
        streams.push(events(index, stream));
    }
    state.metrics.queue.observe(arrival.elapsed().as_secs_f64());
    Ok(Generation {
        state: state.clone(),
        route,
        prompt_lens,
        prompt_of,
        request_id,
        arrival,
        deadline,
        streams,
        choices: vec![ChoiceTiming::default(); total],
        first_token: false,
        cancelled: Box::pin(state.lifecycle.cancelled()),
        _slot: slot,
    })
}

/// One engine sequence's events, tagged with its choice index; `None`
/// marks a stream that closed without a final event.
fn events(index: usize, stream: RequestStream) -> BoxStream<'static, (usize, Option<StreamEvent>)> {
    futures::stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        match stream.recv().await {
            Some(event) => {
                let last = !matches!(event, StreamEvent::Token { .. } | StreamEvent::PromptLogprobs(_));
                Some(((index, Some(event)), (!last).then_some(stream)))
            }
            None => Some(((index, None), None)),
        }
    })
    .boxed()
}

#[derive(Debug, Clone, Copy, Default)]
struct ChoiceTiming {
    last_token: Option<Instant>,
    finished: bool,
}

/// An event of one choice.
#[derive(Debug)]
pub enum ChoiceEvent {
    /// Some of the prompt's logprobs (`prompt_logprobs`), before any token.
    PromptLogprobs {
        index: usize,
        logprobs: Vec<Logprobs>,
    },
    Token {
        index: usize,
        token_id: u32,
        text: String,
        logprobs: Option<Logprobs>,
    },
    Finished {
        index: usize,
        reason: FinishReason,
        text: String,
        matched_stop: Option<MatchedStop>,
        usage: Usage,
    },
}

/// The running engine work of one request. Dropping it cancels whatever is
/// unfinished (the client went away).
pub struct Generation {
    state: AppState,
    route: Route,
    /// Each prompt's length, and the prompt of each choice.
    prompt_lens: Vec<usize>,
    prompt_of: Vec<usize>,
    request_id: String,
    arrival: Instant,
    deadline: Option<Instant>,
    streams: SelectAll<BoxStream<'static, (usize, Option<StreamEvent>)>>,
    choices: Vec<ChoiceTiming>,
    first_token: bool,
    cancelled: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    _slot: Slot,
}

impl Generation {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    pub fn n(&self) -> usize {
        self.choices.len()
    }

    /// The prompts' length in tokens (all of them).
    pub fn prompt_len(&self) -> usize {
        self.prompt_lens.iter().sum()
    }

    /// The request's usage from every choice's: [`total_usage`].
    pub fn total_usage(&self, usages: &[Usage]) -> Usage {
        total_usage(usages, &self.prompt_of)
    }

    /// How the prompt was served (`x-kvc-path`).
    pub fn path(&self) -> kvc_engine::ServePath {
        self.route.path
    }

    /// The next event; `Ok(None)` once every choice has finished. On a
    /// timeout, a shutdown or an engine failure the unfinished sequences
    /// are cancelled and the error returned.
    pub async fn next(&mut self) -> Result<Option<ChoiceEvent>, ApiError> {
        let deadline = self.deadline;
        let event = tokio::select! {
            biased;
            _ = &mut self.cancelled => {
                return Err(self.fail(Finish::Shutdown, ApiError::Unavailable("the server is shutting down; the request was cancelled".into())));
            }
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d.into()).await, None => std::future::pending().await } } => {
                let err = timeout_error(&self.state);
                return Err(self.fail(Finish::Timeout, err));
            }
            event = self.streams.next() => event,
        };
        let now = Instant::now();
        match event {
            None => Ok(None),
            Some((index, Some(StreamEvent::PromptLogprobs(logprobs)))) => Ok(Some(ChoiceEvent::PromptLogprobs { index, logprobs })),
            Some((index, Some(StreamEvent::Token { token_id, text, logprobs }))) => {
                if !self.first_token {
                    self.first_token = true;
                    self.state.metrics.ttft.observe((now - self.arrival).as_secs_f64());
                }
                let timing = &mut self.choices[index];
                if let Some(last) = timing.last_token.replace(now) {
                    self.state.metrics.itl.observe((now - last).as_secs_f64());
                }
                Ok(Some(ChoiceEvent::Token { index, token_id, text, logprobs }))
            }
            Some((index, Some(StreamEvent::Finished { reason, text, matched_stop, mut usage, .. }))) => {
                if let (0, Some(path_reason)) = (index, self.route.reason) {
                    usage.path = self.route.path;
                    usage.path_reason = path_reason.as_str();
                    usage.transferred_tokens = self.route.transferred_tokens;
                    if let Some(c) = self.route.remote_computed_tokens {
                        // Prompt tokens nobody computed for this request.
                        usage.cached_tokens = self.prompt_len().saturating_sub(c);
                    }
                }
                self.choices[index].finished = true;
                self.state.metrics.admission_wait.observe(usage.admission_wait.as_secs_f64());
                self.state.metrics.prefill_wait.observe(usage.prefill_wait.as_secs_f64());
                if self.choices.iter().all(|c| c.finished) {
                    self.state.metrics.e2e.observe((now - self.arrival).as_secs_f64());
                }
                Ok(Some(ChoiceEvent::Finished { index, reason, text, matched_stop, usage }))
            }
            Some((_, Some(StreamEvent::Error(msg)))) => {
                Err(self.fail(Finish::Error, ApiError::Internal(format!("generation failed: {msg}"))))
            }
            // The request's own grammar failed: the client's error (400).
            Some((_, Some(StreamEvent::InvalidGrammar(msg)))) => Err(self.fail(Finish::Error, ApiError::bad_request(msg, None))),
            Some((_, None)) => Err(self.fail(Finish::Error, ApiError::Internal("the engine ended the request without a result".into()))),
        }
    }

    /// Records how a finished choice ended, as reported to the client.
    pub fn record_finish(&self, finish_reason: &str) {
        self.state.metrics.count_finish(Finish::from_reason(finish_reason));
    }

    /// Cancels every unfinished sequence and counts it as `finish`.
    fn fail(&mut self, finish: Finish, err: ApiError) -> ApiError {
        self.streams = SelectAll::new();
        for c in self.choices.iter_mut().filter(|c| !c.finished) {
            c.finished = true;
            self.state.metrics.count_finish(finish);
        }
        tracing::warn!(request_id = %self.request_id, error = %err, "request ended early");
        err
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        let unfinished = self.choices.iter().filter(|c| !c.finished).count();
        for _ in 0..unfinished {
            self.state.metrics.count_finish(Finish::Abort);
        }
    }
}

/// Sums the choices' usage: each prompt once (`prompt_of[i]`: choice i's
/// prompt), every choice's completion, and per prompt the cached tokens of
/// the choice that reused the least.
pub fn total_usage(usages: &[Usage], prompt_of: &[usize]) -> Usage {
    let Some(first) = usages.first() else {
        return Usage::default();
    };
    let mut prompt_tokens = 0;
    let mut cached_tokens = 0;
    let prompts = prompt_of.iter().copied().max().map_or(1, |p| p + 1);
    for p in 0..prompts {
        let of_p = || usages.iter().enumerate().filter(move |(i, _)| prompt_of.get(*i).copied().unwrap_or(0) == p).map(|(_, u)| u);
        prompt_tokens += of_p().map(|u| u.prompt_tokens).max().unwrap_or(0);
        cached_tokens += of_p().map(|u| u.cached_tokens).min().unwrap_or(0);
    }
    Usage { prompt_tokens, completion_tokens: usages.iter().map(|u| u.completion_tokens).sum(), cached_tokens, ..*first }
}

pub fn log_finished(request_id: &str, index: usize, reason: &str, usage: &Usage) {
    tracing::info!(
        request_id,
        index,
        finish_reason = reason,
        prompt_tokens = usage.prompt_tokens,
        cached_tokens = usage.cached_tokens,
        completion_tokens = usage.completion_tokens,
        "choice finished"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_of_n_choices_counts_the_prompt_once() {
        let u =
            |completion, cached| Usage { prompt_tokens: 10, completion_tokens: completion, cached_tokens: cached, ..Default::default() };
        let total = total_usage(&[u(3, 0), u(5, 8), u(1, 8)], &[0, 0, 0]);
        assert_eq!((total.prompt_tokens, total.completion_tokens, total.cached_tokens), (10, 9, 0));
        assert_eq!(total_usage(&[], &[]).prompt_tokens, 0);
    }

    #[test]
    fn usage_of_several_prompts_counts_each_prompt_once() {
        let u = |prompt, completion, cached| Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
            ..Default::default()
        };
        // Two prompts of 10 and 4 tokens, two choices each.
        let total = total_usage(&[u(10, 3, 0), u(10, 5, 8), u(4, 1, 4), u(4, 2, 4)], &[0, 0, 1, 1]);
        assert_eq!((total.prompt_tokens, total.completion_tokens, total.cached_tokens), (14, 11, 4));
    }
}
