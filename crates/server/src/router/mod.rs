//! `--role router`: an OpenAI front for several workers (`--decode-peer
//! URL`, repeatable; `both` or `decode` workers). See
//! docs/disaggregation.md.
//!
//! - [`peers`]: polls each worker's `/internal/state` (with
//!   `--cluster-token`) every `--peer-poll-interval-s`; health with backoff.
//! - [`proxy`]: places each generation request with
//!   `kvc_disagg::routing::choose_worker` (one score over session
//!   residency, free capacity and load), forwards it, streams the answer
//!   back, retries another worker when one cannot be reached, and moves
//!   sessions whose worker is full or unhealthy.
//! - [`session_homes`]: the worker of each session's last turn.
//! - [`estimate`]: token estimates read from a body without a tokenizer.
//! - [`metrics`]: `GET /metrics` (`kvc_router_*`).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models[/{model}]` (from a healthy worker),
//! `GET|DELETE /v1/sessions/{id}` (on the session's worker), `GET /health`
//! (200 while at least one worker is healthy), `GET /health/live`,
//! `GET /metrics`, `GET /router/workers` (the router's view, for operators
//! and tests). `--api-key` guards `/v1/*` as on workers; the router passes
//! the client's `authorization` on, so workers may check it too.

pub mod estimate;
pub mod metrics;
pub mod peers;
pub mod proxy;
pub mod session_homes;
pub mod state;

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::args::Args;
use crate::error::ApiError;
use crate::sessions::SessionPath;
pub use state::RouterState;

pub fn app(state: RouterState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{model}", get(get_model))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    let ops = Router::new()
        .route("/health", get(health))
        .route("/health/live", get(|| async { Json(json!({"status": "alive"})) }))
        .route("/metrics", get(metrics_text))
        .route("/router/workers", get(workers));
    Router::new()
        .merge(v1)
        .merge(ops)
        .fallback(|method: Method, uri: Uri| async move { ApiError::NoRoute { method: method.to_string(), path: uri.path().to_string() } })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }
        })
        .layer(DefaultBodyLimit::max(state.config.max_request_body_bytes))
        .with_state(state)
}

/// `--api-key` on `/v1/*`, with the workers' rule ([`crate::auth::check_api_key`]); the
/// caller's namespace goes with the request, as on a worker, so that the
/// router keys sessions as the workers do.
async fn require_api_key(State(state): State<RouterState>, req: Request, next: Next) -> Response {
    crate::auth::admit_api_key(&state.config.api_keys, req, next).await
}

/// Ready while not draining and at least one worker is healthy.
async fn health(State(state): State<RouterState>) -> (StatusCode, Json<Value>) {
    let healthy = state.peers.healthy_count();
    let total = state.peers.list.len();
    if state.lifecycle.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "draining", "reason": "the router is shutting down"})))
    } else if healthy == 0 {
        let body = json!({"status": "no_healthy_worker", "healthy_workers": 0, "workers": total});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body))
    } else {
        (StatusCode::OK, Json(json!({"status": "ready", "healthy_workers": healthy, "workers": total})))
    }
}

async fn metrics_text(State(state): State<RouterState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, crate::prom::CONTENT_TYPE)], state.metrics.render())
}

/// The router's view of its workers.
async fn workers(State(state): State<RouterState>) -> Json<Value> {
    let list: Vec<Value> = state
        .peers
        .list
        .iter()
        .map(|p| {
            let v = p.view(None);
            json!({
                "url": p.url, "healthy": p.is_healthy(), "in_flight": p.in_flight(),
                "total_blocks": v.total_blocks, "available_blocks": v.available_blocks(), "active": v.active,
                "polled_ms_ago": p.polled_at().map(|t| t.elapsed().as_millis() as u64),
            })
        })
        .collect();
    Json(json!({"workers": list, "sessions": state.homes.len()}))
}

async fn list_models(State(state): State<RouterState>, headers: HeaderMap) -> Response {
    from_any_worker(&state, "/v1/models", &headers).await
}

async fn get_model(State(state): State<RouterState>, Path(model): Path<String>, headers: HeaderMap) -> Response {
    let mut url = match reqwest::Url::parse("http://x/") {
        Ok(u) => u,
        Err(e) => return ApiError::Internal(e.to_string()).into_response(),
    };
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(["v1", "models", &model]);
    }
    from_any_worker(&state, url.path(), &headers).await
}

/// A GET any worker can answer: healthy workers first, the next one when
/// one cannot be reached.
async fn from_any_worker(state: &RouterState, path: &str, headers: &HeaderMap) -> Response {
    for i in proxy::any_worker_order(state) {
        let base = &state.peers.list[i].url;
        let Ok(url) = reqwest::Url::parse(&format!("{base}{path}")) else {
            continue;
        };
        match proxy::forward_simple(state, i, reqwest::Method::GET, url, headers).await {
            Ok(r) => return r,
            Err(e) => state.peers.mark_failed(i, &e),
        }
    }
    ApiError::Unavailable("no worker answered; retry later".into()).into_response()
}

/// The workers that may hold `id`: its home first, then those whose
/// polled state lists it.
fn session_workers(state: &RouterState, id: &str) -> Vec<usize> {
    let mut out: Vec<usize> = state.homes.get(id).map(|h| h.worker).into_iter().collect();
    for (i, p) in state.peers.list.iter().enumerate() {
        if !out.contains(&i) && p.holds_session(id) {
            out.push(i);
        }
    }
    out
}

/// The workers that may hold the caller's session (keyed as the workers
/// key it, [`SessionPath`]) with the URL of the session there.
fn session_targets(state: &RouterState, session: &SessionPath) -> Result<Vec<(usize, reqwest::Url)>, ApiError> {
    session_workers(state, &session.key)
        .into_iter()
        .map(|i| Ok((i, proxy::session_url_salted(&state.peers.list[i].url, &session.id, session.salt.as_deref())?)))
        .collect()
}

/// `GET /v1/sessions/{id}`: the session's worker's answer.
async fn get_session(State(state): State<RouterState>, session: SessionPath, headers: HeaderMap) -> Result<Response, ApiError> {
    for (i, url) in session_targets(&state, &session)? {
        match proxy::forward_simple(&state, i, reqwest::Method::GET, url, &headers).await {
            Ok(r) if r.status() != StatusCode::NOT_FOUND => return Ok(r),
            Ok(_) => continue,
            Err(e) => state.peers.mark_failed(i, &e),
        }
    }
    Err(ApiError::SessionNotFound { id: session.id })
}

/// `DELETE /v1/sessions/{id}`: deleted wherever it is (the caller's own
/// session: another key's of the same id is untouched); the router forgets
/// its home once a worker deleted it.
async fn delete_session(State(state): State<RouterState>, session: SessionPath, headers: HeaderMap) -> Result<Response, ApiError> {
    let mut answer = None;
    for (i, url) in session_targets(&state, &session)? {
        match proxy::forward_simple(&state, i, reqwest::Method::DELETE, url, &headers).await {
            Ok(r) if r.status().is_success() => answer = Some(r),
            Ok(_) => {}
            Err(e) => state.peers.mark_failed(i, &e),
        }
    }
    match answer {
        Some(r) => {
            state.homes.forget(&session.key);
            Ok(r)
        }
        None => Err(ApiError::SessionNotFound { id: session.id }),
    }
}

/// Serves the router until SIGINT / SIGTERM, then drains like a worker
/// ([`crate::shutdown`]): no new connections, requests in flight get
/// `--shutdown-timeout-s`, then their streams are cut.
pub async fn serve(args: &Args) -> anyhow::Result<()> {
    let config = args.serving.server_config();
    let token = config.cluster_token.clone().unwrap_or_default();
    let interval = Duration::from_secs_f64(args.disagg.peer_poll_interval_s.max(0.01));
    let (shutdown_timeout, limits) = (config.shutdown_timeout, config.conn_limits);
    let mut state = RouterState::new(&args.disagg.decode_peers, config)?;
    state.weights.prefill_weight = args.disagg.kv_overlap_score_weight;
    state.peers.spawn_pollers(state.client.clone(), token, interval);
    let homes = state.homes.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            homes.prune(session_homes::FORGET_AFTER);
        }
    });
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind {}:{}: {e}", args.host, args.port))?;
    let urls: Vec<&str> = state.peers.list.iter().map(|p| p.url.as_str()).collect();
    tracing::info!(
        addr = %listener.local_addr()?, workers = ?urls, poll_interval_s = interval.as_secs_f64(),
        api_key = !state.config.api_keys.is_empty(), "kvc-server router listening"
    );
    if let Some(w) = crate::auth::exposure_warning(&listener.local_addr()?, !state.config.api_keys.is_empty()) {
        tracing::warn!(addr = %listener.local_addr()?, "{w}");
    }
    let lifecycle = state.lifecycle.clone();
    crate::shutdown::serve_until(listener, app(state), lifecycle, shutdown_timeout, limits, crate::shutdown::signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::routing::delete;
    use kvc_disagg::protocol::WorkerState;
    use kvc_disagg::routing::RouteReason;

    use super::metrics::counted::placements;
    use super::*;
    use crate::state::ServerConfig;

    /// A stand-in worker: publishes a state, answers completions with its
    /// name, records deleted sessions.
    async fn fake_worker(name: &'static str, deleted: Arc<Mutex<Vec<String>>>) -> String {
        let state = WorkerState { ready: true, block_size: 16, total_blocks: 100, free_blocks: 100, ..Default::default() };
        let app = Router::new()
            .route("/internal/state", get(move || async move { Json(state.clone()) }))
            .route(
                "/v1/completions",
                post(move |headers: HeaderMap| async move {
                    let session = headers.get("x-session-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    ([("x-kvc-path", "local"), ("x-request-id", "cmpl-1")], Json(json!({"worker": name, "session": session})))
                }),
            )
            .route(
                "/v1/sessions/{id}",
                delete(move |Path(id): Path<String>| async move {
                    deleted.lock().unwrap().push(id);
                    Json(json!({"deleted": true}))
                }),
            );
        spawn_app(app).await
    }

    async fn spawn_app(app: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// A URL nothing listens on.
    async fn dead_url() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    }

    fn ready() -> WorkerState {
        WorkerState { ready: true, block_size: 16, total_blocks: 100, free_blocks: 100, ..Default::default() }
    }

    async fn post_completion(router: &str, session: &str) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{router}/v1/completions"))
            .header("x-session-id", session)
            .body(r#"{"prompt": [1, 2, 3], "max_tokens": 4}"#)
            .send()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_worker_that_cannot_be_reached_is_skipped_retried_elsewhere_and_marked_unhealthy() {
        let _turn = metrics::counted::turn().await;
        let deleted = Arc::new(Mutex::new(Vec::new()));
        let (dead, alive) = (dead_url().await, fake_worker("a", deleted.clone()).await);
        let state = RouterState::new(&[dead.clone(), alive.clone()], ServerConfig::default()).unwrap();
        // Both look healthy; equal scores send the first request to the dead one.
        state.peers.apply_poll(0, Ok(ready()));
        state.peers.apply_poll(1, Ok(ready()));
        let router = spawn_app(app(state.clone())).await;
        let resident = placements(RouteReason::SessionResident);

        let r = post_completion(&router, "s-1").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvc-worker"], alive.as_str());
        assert_eq!(r.headers()["x-kvc-path"], "local");
        assert_eq!(r.headers()["x-request-id"], "cmpl-1");
        assert_eq!(r.json::<Value>().await.unwrap(), json!({"worker": "a", "session": "s-1"}));
        assert!(!state.peers.list[0].is_healthy());
        let text = state.metrics.render();
        assert!(text.contains("kvc_router_retries_total 1"), "{text}");
        assert!(text.contains(&format!("kvc_router_peer_health_changes_total{{worker=\"{dead}\",to=\"unhealthy\"}} 1")), "{text}");
        assert_eq!(state.homes.get("s-1").map(|h| h.worker), Some(1));

        // The session stays; the dead worker's health returning does not move it.
        state.peers.apply_poll(0, Ok(ready()));
        let r = post_completion(&router, "s-1").await;
        assert_eq!(r.headers()["x-kvc-worker"], alive.as_str());
        assert_eq!(placements(RouteReason::SessionResident), resident + 1);
        assert!(deleted.lock().unwrap().is_empty());
    }

    /// A report taken while a turn ran but read after its answer (the poll
    /// crossed the turn's end) must not make the session's home look busy:
    /// its next turn stays (the worker may have died since, and then no
    /// later poll would correct it).
    #[tokio::test]
    async fn a_report_read_after_the_answer_it_counts_does_not_move_the_session() {
        let _turn = metrics::counted::turn().await;
        let (a, b) = (fake_worker("a", Arc::default()).await, fake_worker("b", Arc::default()).await);
        let state = RouterState::new(&[a, b], ServerConfig::default()).unwrap();
        state.peers.apply_poll(0, Ok(ready()));
        state.peers.apply_poll(1, Ok(ready()));
        let router = spawn_app(app(state.clone())).await;
        let resident = placements(RouteReason::SessionResident);
        // The poll of a goes out, the turn runs and is answered, the report
        // (taken with the turn running: one request, its block in use) comes.
        state.peers.list[0].mark_polling();
        assert_eq!(post_completion(&router, "s-2").await.json::<Value>().await.unwrap()["worker"], "a");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while state.peers.list[0].in_flight() > 0 {
            assert!(std::time::Instant::now() < deadline, "the answered turn is still counted in flight");
            tokio::task::yield_now().await;
        }
        state.peers.apply_poll(0, Ok(WorkerState { running: 1, free_blocks: 99, ..ready() }));
        assert_eq!(post_completion(&router, "s-2").await.json::<Value>().await.unwrap()["worker"], "a");
        assert_eq!(placements(RouteReason::SessionResident), resident + 1);
        let text = state.metrics.render();
        assert!(text.contains("kvc_router_session_moves_total{reason=\"moved_load\"} 0"), "{text}");
    }

    #[tokio::test]
    async fn a_moved_session_is_counted_and_dropped_from_its_old_worker() {
        let _turn = metrics::counted::turn().await;
        let (deleted_a, deleted_b) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let a = fake_worker("a", deleted_a.clone()).await;
        let b = fake_worker("b", deleted_b.clone()).await;
        let state = RouterState::new(&[a, b], ServerConfig::default()).unwrap();
        state.peers.apply_poll(0, Ok(ready()));
        state.peers.apply_poll(1, Ok(ready()));
        let router = spawn_app(app(state.clone())).await;
        assert_eq!(post_completion(&router, "s-9").await.json::<Value>().await.unwrap()["worker"], "a");
        // Worker a fills up: the next turn goes to b and a's copy is dropped.
        state.peers.apply_poll(0, Ok(WorkerState { free_blocks: 0, ..ready() }));
        assert_eq!(post_completion(&router, "s-9").await.json::<Value>().await.unwrap()["worker"], "b");
        let text = state.metrics.render();
        assert!(text.contains("kvc_router_session_moves_total{reason=\"moved_full\"} 1"), "{text}");
        for _ in 0..200 {
            if !deleted_a.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*deleted_a.lock().unwrap(), vec!["s-9".to_string()]);
        assert!(deleted_b.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn without_a_healthy_worker_the_router_is_unready_and_answers_503_json() {
        let _turn = metrics::counted::turn().await;
        let state = RouterState::new(&[dead_url().await], ServerConfig::default()).unwrap();
        let router = spawn_app(app(state.clone())).await;
        let refused = placements(RouteReason::NoHealthyWorker);
        let r = post_completion(&router, "s").await;
        assert_eq!(r.status(), 503);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["type"], "service_unavailable_error");
        let h = reqwest::get(format!("{router}/health")).await.unwrap();
        assert_eq!(h.status(), 503);
        let text = state.metrics.render();
        assert_eq!(placements(RouteReason::NoHealthyWorker), refused + 1);
        assert!(text.contains("kvc_router_requests_total{worker=\"none\",status=\"503\"} 1"), "{text}");
    }

    /// A worker that dies mid-stream: the client still gets an error event
    /// and `[DONE]`, not a cut connection.
    #[tokio::test]
    async fn a_stream_cut_by_its_worker_ends_with_an_error_event_and_done() {
        use futures::StreamExt;
        let _turn = metrics::counted::turn().await;
        // The worker sends one event, then dies when the test says so (once
        // the client has that event).
        let (die, died) = tokio::sync::oneshot::channel::<()>();
        let died = Arc::new(Mutex::new(Some(died)));
        let dying = Router::new().route("/internal/state", get(|| async { Json(ready()) })).route(
            "/v1/completions",
            post(move || {
                let died = died.lock().unwrap().take().expect("one request");
                async move {
                    let first = futures::stream::once(async {
                        Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"data: {\"choices\": [{\"text\": \"a\"}]}\n\n"))
                    });
                    let then = futures::stream::once(async move {
                        let _ = died.await;
                        Err(std::io::Error::other("worker died"))
                    });
                    ([("content-type", "text/event-stream")], axum::body::Body::from_stream(first.chain(then)))
                }
            }),
        );
        let worker = spawn_app(dying).await;
        let state = RouterState::new(&[worker], ServerConfig::default()).unwrap();
        state.peers.apply_poll(0, Ok(ready()));
        let router = spawn_app(app(state)).await;
        let r = post_completion(&router, "s-cut").await;
        assert_eq!(r.status(), 200);
        let mut body = std::pin::pin!(r.bytes_stream());
        let mut text = String::new();
        while !text.contains("\n\n") {
            text.push_str(std::str::from_utf8(&body.next().await.expect("the first event").unwrap()).unwrap());
        }
        die.send(()).unwrap();
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.expect("the stream ends cleanly")).unwrap());
        }
        assert!(text.starts_with("data: {\"choices\""), "{text}");
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
        let error: Value = serde_json::from_str(events[events.len() - 2].trim_start_matches("data: ")).unwrap();
        assert_eq!(error["error"]["type"], "service_unavailable_error", "{text}");
    }

    /// 503 from the router carries Retry-After.
    #[tokio::test]
    async fn no_healthy_worker_answers_503_with_retry_after() {
        let _turn = metrics::counted::turn().await;
        let state = RouterState::new(&[dead_url().await], ServerConfig::default()).unwrap();
        let router = spawn_app(app(state)).await;
        let r = post_completion(&router, "s").await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
    }

    #[tokio::test]
    async fn api_key_and_body_limit_guard_v1() {
        let config = ServerConfig { api_keys: vec!["k".into()], max_request_body_bytes: 64, ..ServerConfig::default() };
        let state = RouterState::new(&[dead_url().await], config).unwrap();
        let router = spawn_app(app(state)).await;
        let client = reqwest::Client::new();
        let r = client.post(format!("{router}/v1/completions")).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_api_key");
        let r = client.post(format!("{router}/v1/completions")).bearer_auth("k").body(vec![b' '; 1000]).send().await.unwrap();
        assert_eq!(r.status(), 413);
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "request_too_large");
        // Probes stay open.
        assert_eq!(client.get(format!("{router}/health/live")).send().await.unwrap().status(), 200);
    }
}
