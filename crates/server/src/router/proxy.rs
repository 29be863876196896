//! Forwarding a generation request (`POST /v1/chat/completions`,
//! `POST /v1/completions`) to the worker the policy picks, and streaming
//! its answer back unchanged.
//!
//! 1. Read the body (at most `--max-request-body-bytes`, else 413), find
//!    the session (body `session_id`, else header `x-session-id`; exact
//!    match) and estimate the request's tokens ([`super::estimate`]).
//! 2. [`choose_worker`] over the workers' views; one `event="route"` log
//!    line with the decision, its reason and every worker's score terms.
//! 3. Forward the same body with `authorization` and `x-session-id`. If the
//!    worker cannot be reached, or answers 503 (draining), before any byte
//!    of an answer, it is marked unhealthy and the next best worker is
//!    tried (each worker at most once).
//! 4. Stream the answer back as it arrives (status, `content-type`,
//!    `x-kvc-path`, `x-request-id`, ... and `x-kvc-worker: <url>`), so SSE
//!    works through the router.
//! 5. On success the worker becomes the session's home. If it differs from
//!    the previous home, that is a session move: counted by reason, and the
//!    old home's stale copy is deleted (best effort, if it is healthy).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use kvc_disagg::routing::{choose_worker, RouteDecision, RouteRequest, WorkerView};

use super::estimate::{estimate, Endpoint, Estimate};
use super::session_homes::resident_hint;
use super::state::RouterState;
use crate::error::ApiError;
use crate::sessions::SESSION_HEADER;

/// Header naming the worker that served the answer.
pub const WORKER_HEADER: &str = "x-kvc-worker";

/// Request headers the router passes on to the worker.
const FORWARDED_REQUEST_HEADERS: [&str; 3] = ["authorization", SESSION_HEADER, "content-type"];

/// Worker answer headers the router passes back to the client.
const FORWARDED_RESPONSE_HEADERS: [&str; 7] =
    ["content-type", "cache-control", "x-kvc-path", "x-request-id", "retry-after", "www-authenticate", "x-should-retry"];

pub async fn chat_completions(State(state): State<RouterState>, req: Request) -> Response {
    forward_generation(state, Endpoint::Chat, req).await
}

pub async fn completions(State(state): State<RouterState>, req: Request) -> Response {
    forward_generation(state, Endpoint::Completions, req).await
}

fn path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
    }
}

/// The body, within `--max-request-body-bytes` and `--body-read-timeout-s`
/// ([`crate::extract::read_body`]: 413, 408).
pub async fn read_body(state: &RouterState, req: Request) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = req.headers().clone();
    let limit = crate::state::BodyLimit { bytes: state.config.max_request_body_bytes, read_timeout: state.config.body_read_timeout };
    Ok((headers, crate::extract::read_body(req, limit).await?))
}

async fn forward_generation(state: RouterState, endpoint: Endpoint, req: Request) -> Response {
    let tenant = crate::tenant::Tenant::of_request(req.extensions());
    let (headers, body) = match read_body(&state, req).await {
        Ok(v) => v,
        Err(e) => return answer_error(&state, e),
    };
    let est = estimate(endpoint, &body);
    // The session as the workers key it (the caller's namespace, its salt):
    // what their published state lists and the router's homes hold.
    let session = match crate::sessions::session_id(est.session_id.as_deref(), &headers).and_then(|id| {
        id.map(|id| {
            Ok(RoutedSession { key: crate::sessions::scoped(&tenant, est.cache_salt.as_deref(), &id)?, id, salt: est.cache_salt.clone() })
        })
        .transpose()
    }) {
        Ok(s) => s,
        Err(e) => return answer_error(&state, e),
    };
    let route_id = uuid::Uuid::new_v4().simple().to_string();
    let mut excluded = vec![false; state.peers.list.len()];
    for attempt in 0..state.peers.list.len().max(1) {
        if attempt > 0 {
            state.metrics.count_retry();
        }
        let decision = decide(&state, session.as_ref().map(|s| s.key.as_str()), &est, &excluded);
        let worker_url = decision.worker.map(|i| state.peers.list[i].url.as_str()).unwrap_or("none");
        tracing::info!(
            event = "route", route_id = %route_id, session = session.as_ref().map_or("", |s| s.id.as_str()), endpoint = path(endpoint),
            worker = worker_url, reason = decision.reason.as_str(), attempt,
            home = ?decision.home.map(|h| state.peers.list[h].url.as_str()),
            prompt_tokens = est.prompt_tokens, max_tokens = est.max_tokens, scores = %decision.scores_text(),
            "route decision"
        );
        state.metrics.count_decision(&decision);
        let Some(i) = decision.worker else {
            return answer_error(&state, ApiError::Unavailable("no healthy worker can take the request; retry later".into()));
        };
        let peer = state.peers.list[i].clone();
        let in_flight = peer.start_request(decision.scores[i].needed_blocks);
        let mut request = state.client.post(format!("{}{}", peer.url, path(endpoint))).body(body.clone());
        for name in FORWARDED_REQUEST_HEADERS {
            if let Some(v) = headers.get(name) {
                request = request.header(name, v.clone());
            }
        }
        if !headers.contains_key("content-type") {
            request = request.header("content-type", "application/json");
        }
        let failure = match request.send().await {
            Ok(r) if r.status() != StatusCode::SERVICE_UNAVAILABLE => {
                if r.status().is_success() {
                    if let Some(s) = session.as_ref() {
                        settle_session(&state, s, i, &decision, est.prompt_tokens + est.max_tokens, &headers);
                    }
                }
                state.metrics.count_request(&peer.url, r.status().as_u16());
                let session_done = session.as_ref().filter(|_| r.status().is_success());
                return stream_back(&state, r, &peer.url, in_flight, session_done.map(|s| (s.key.clone(), i)));
            }
            Ok(r) => format!("answered {}", r.status()),
            Err(e) => crate::peer_poll::error_text(&e),
        };
        drop(in_flight);
        tracing::warn!(event = "route_retry", route_id = %route_id, worker = %peer.url, error = %failure, "forward failed before any answer; trying another worker");
        state.peers.mark_failed(i, &failure);
        excluded[i] = true;
    }
    answer_error(&state, ApiError::Unavailable("every worker failed to take the request; retry later".into()))
}

/// The policy's input from the workers' views plus the router's memory.
fn decide(state: &RouterState, session: Option<&str>, est: &Estimate, excluded: &[bool]) -> RouteDecision {
    let home = session.and_then(|s| state.homes.get(s));
    let views: Vec<WorkerView> = state
        .peers
        .list
        .iter()
        .enumerate()
        .map(|(i, peer)| {
            let mut view = peer.view(session);
            view.healthy &= !excluded[i];
            view.resident_tokens = view.resident_tokens.max(resident_hint(home.as_ref(), i, peer.polled_at()));
            view
        })
        .collect();
    let req = RouteRequest { prompt_tokens: est.prompt_tokens, max_tokens: est.max_tokens, home: home.map(|h| h.worker) };
    choose_worker(&req, &views, &state.weights)
}

/// The session is served by worker `i` now; a different previous home is
/// a move, and the old copy is dropped.
fn settle_session(state: &RouterState, s: &RoutedSession, i: usize, decision: &RouteDecision, tokens: usize, headers: &HeaderMap) {
    let previous = state.homes.set(&s.key, i, tokens);
    let session = s.id.as_str();
    let old = match (previous.map(|h| h.worker), decision.home) {
        (Some(p), _) if p != i => p,
        (None, Some(h)) if h != i => h,
        _ => return,
    };
    let old_peer = state.peers.list[old].clone();
    tracing::info!(
        event = "session_move", session, from = %old_peer.url, to = %state.peers.list[i].url, reason = decision.reason.as_str(),
        "session moved to another worker"
    );
    state.metrics.count_move(decision.reason);
    if !old_peer.is_healthy() {
        return;
    }
    let (client, session, auth) = (state.client.clone(), session.to_string(), headers.get("authorization").cloned());
    let salt = s.salt.clone();
    tokio::spawn(async move {
        let Ok(url) = session_url_salted(&old_peer.url, &session, salt.as_deref()) else {
            return;
        };
        let mut request = client.delete(url).timeout(std::time::Duration::from_secs(10));
        if let Some(a) = auth {
            request = request.header("authorization", a);
        }
        match request.send().await {
            Ok(r) => {
                tracing::info!(event = "session_drop", session, worker = %old_peer.url, status = r.status().as_u16(), "dropped the moved session's stale copy")
            }
            Err(e) => {
                tracing::warn!(event = "session_drop", session, worker = %old_peer.url, error = %e, "could not drop the moved session's stale copy")
            }
        }
    });
}

/// A session a generation request names: the client's id, its salt, and
/// the id the workers keep it under ([`crate::sessions::scoped`]).
struct RoutedSession {
    id: String,
    salt: Option<String>,
    key: String,
}

/// [`session_url`] with `?cache_salt=` when the session is salted.
pub fn session_url_salted(base: &str, id: &str, salt: Option<&str>) -> Result<reqwest::Url, ApiError> {
    let mut url = session_url(base, id)?;
    if let Some(salt) = salt {
        url.query_pairs_mut().append_pair("cache_salt", salt);
    }
    Ok(url)
}

/// `{base}/v1/sessions/{id}` with the id percent-encoded as one segment.
pub fn session_url(base: &str, id: &str) -> Result<reqwest::Url, ApiError> {
    let mut url = reqwest::Url::parse(base).map_err(|e| ApiError::Internal(format!("bad worker url {base}: {e}")))?;
    url.path_segments_mut()
        .map_err(|_| ApiError::Internal(format!("bad worker url {base}")))?
        .pop_if_empty()
        .extend(["v1", "sessions", id]);
    Ok(url)
}

/// Keeps the worker's in-flight count and refreshes the session's home
/// when the answer's body is done (or the client went away).
struct Finish {
    _in_flight: super::peers::Forwarded,
    session: Option<(String, usize)>,
    state: RouterState,
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some((id, worker)) = &self.session {
            self.state.homes.touch(id, *worker);
        }
    }
}

/// The worker's answer, streamed through unchanged; cut off when shutdown
/// cancels requests in flight.
pub fn stream_back(
    state: &RouterState,
    r: reqwest::Response,
    worker: &str,
    in_flight: super::peers::Forwarded,
    session: Option<(String, usize)>,
) -> Response {
    let status = r.status();
    let mut headers = HeaderMap::new();
    for name in FORWARDED_RESPONSE_HEADERS {
        if let Some(v) = r.headers().get(name) {
            headers.insert(HeaderName::from_static(name), v.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(worker) {
        headers.insert(HeaderName::from_static(WORKER_HEADER), v);
    }
    let sse =
        r.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/event-stream"));
    let finish = Finish { _in_flight: in_flight, session, state: state.clone() };
    let worker = worker.to_string();
    let stream = r.bytes_stream().take_until(state.lifecycle.cancelled()).scan(false, move |ended, chunk| {
        let _keep = &finish;
        if *ended {
            return std::future::ready(None);
        }
        std::future::ready(Some(match chunk {
            Ok(bytes) => Ok(bytes),
            // The worker went away mid-stream: end the stream as a worker
            // does when it fails mid-stream (an error event, then [DONE]).
            Err(e) if sse => {
                *ended = true;
                tracing::warn!(event = "stream_failed", worker = %worker, error = %e, "worker failed mid-stream");
                Ok(sse_error_tail(&ApiError::Unavailable(format!("the worker serving this stream failed: {e}; retry the request"))))
            }
            Err(e) => {
                *ended = true;
                Err(e)
            }
        }))
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// Ends an SSE stream with an OpenAI error event and `[DONE]`; the blank
/// line first ends any event the worker left half-written.
fn sse_error_tail(err: &ApiError) -> Bytes {
    let (_, body) = crate::error::error_response(err);
    let json = serde_json::to_string(&body).unwrap_or_default();
    Bytes::from(format!("\n\ndata: {json}\n\ndata: [DONE]\n\n"))
}

/// The router's own error answer, counted under `worker="none"`.
pub fn answer_error(state: &RouterState, e: ApiError) -> Response {
    let response = e.into_response();
    state.metrics.count_request("none", response.status().as_u16());
    response
}

/// Workers in order of preference for a request that any worker can
/// answer (`/v1/models`): healthy ones first.
pub fn any_worker_order(state: &RouterState) -> Vec<usize> {
    let mut order: Vec<usize> = (0..state.peers.list.len()).collect();
    order.sort_by_key(|&i| !state.peers.list[i].is_healthy());
    order
}

/// A plain GET/DELETE forwarded to worker `i` with the client's
/// `authorization`, answered unchanged plus `x-kvc-worker`.
pub async fn forward_simple(
    state: &RouterState,
    i: usize,
    method: reqwest::Method,
    url: reqwest::Url,
    headers: &HeaderMap,
) -> Result<Response, String> {
    let peer: Arc<super::peers::Peer> = state.peers.list[i].clone();
    let in_flight = peer.start_request(0);
    let mut request = state.client.request(method, url);
    if let Some(a) = headers.get("authorization") {
        request = request.header("authorization", a.clone());
    }
    let r = request.send().await.map_err(|e| crate::peer_poll::error_text(&e))?;
    Ok(stream_back(state, r, &peer.url, in_flight, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_urls_encode_the_id_as_one_segment() {
        assert_eq!(session_url("http://w:1", "s-1").unwrap().as_str(), "http://w:1/v1/sessions/s-1");
        assert_eq!(session_url("http://w:1/", "a/b c?").unwrap().as_str(), "http://w:1/v1/sessions/a%2Fb%20c%3F");
    }
}
