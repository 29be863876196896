//! The worker's route table ([`router`]) and serving it ([`serve_worker`],
//! [`serve`]): the `/v1/*` routes behind the API key, `/internal/*` behind
//! the cluster token, the probes and `/metrics` open, and the fallbacks
//! for unknown routes and methods. Only `main` (and tests) import this
//! module; handlers take [`AppState`] from [`crate::state`].

use std::time::Instant;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kvc_engine::EngineHandle;

use crate::auth::{exposure_warning, require_api_key, require_cluster_token};
use crate::error::ApiError;
use crate::state::{AppState, Arrival, BodyLimit, ServerConfig};

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/completions", post(crate::completions::completions))
        .route("/v1/models", get(crate::models::list_models))
        .route("/v1/models/{model}", get(crate::models::get_model))
        .route("/v1/sessions/{id}", get(crate::sessions::get_session).delete(crate::sessions::delete_session))
        .route("/v1/sessions/{id}/snapshot", get(crate::pd::prefill::snapshot_status))
        .route("/v1/admission", post(crate::sessions::admission))
        .route("/reset_prefix_cache", post(crate::sessions::reset_prefix_cache))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    let internal = internal().route_layer(middleware::from_fn_with_state(state.clone(), require_cluster_token));
    let ops = Router::new()
        .route("/health", get(crate::health::health))
        .route("/health/live", get(crate::health::live))
        .route("/metrics", get(metrics));
    Router::new()
        .merge(v1)
        .merge(internal)
        .merge(ops)
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), track_request))
        .layer(DefaultBodyLimit::max(state.config.max_request_body_bytes))
        .with_state(state)
}

/// Worker-to-worker routes (`/internal/*`, [`crate::internal`]).
fn internal() -> Router<AppState> {
    Router::new()
        .route("/internal/ping", get(crate::internal::ping))
        .route("/internal/state", get(crate::worker_state::get_state))
        .route("/internal/kv/handshake", get(crate::pd::prefill::handshake))
        .route("/internal/prefill", post(crate::pd::prefill::remote_prefill))
        .route("/internal/snapshot/reserve", post(crate::pd::prefill::snapshot_reserve))
        .route("/internal/snapshot/commit", post(crate::pd::prefill::snapshot_commit))
        .route("/internal/snapshot/abort", post(crate::pd::prefill::snapshot_abort))
}

/// Stamps the arrival time and body limit on the request, and counts the
/// answer's status class (probes and scrapes excluded).
async fn track_request(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let probe = matches!(req.uri().path(), "/health" | "/health/live" | "/metrics");
    req.extensions_mut().insert(Arrival(Instant::now()));
    req.extensions_mut().insert(BodyLimit { bytes: state.config.max_request_body_bytes, read_timeout: state.config.body_read_timeout });
    let response = next.run(req).await;
    if !probe {
        state.metrics.count_status(response.status().as_u16());
    }
    response
}

/// `GET /metrics`: the Prometheus text of the worker's registry
/// ([`crate::metrics`]).
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, crate::prom::CONTENT_TYPE)], state.metrics.render())
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NoRoute { method: method.to_string(), path: uri.path().to_string() }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }
}

/// Serves a worker role (`both`, `prefill`, `decode`) as the flags say:
/// binds the port at once, answers probes while the engine loads
/// ([`crate::loading`]), then serves everything on the same socket.
pub async fn serve_worker(engine_config: kvc_engine::EngineConfig, args: &crate::args::Args) -> anyhow::Result<()> {
    let host = args.host.as_str();
    let listener = std::net::TcpListener::bind((host, args.port)).map_err(|e| anyhow::anyhow!("cannot bind {host}:{}: {e}", args.port))?;
    listener.set_nonblocking(true)?;
    tracing::info!(addr = %listener.local_addr()?, role = %args.role_name(), "answering probes while the engine loads (/health 503 until ready, /health/live 200)");
    let config = ServerConfig { enable_session_cache: !args.no_enable_session_cache, ..args.serving.server_config() };
    let Some(engine) = crate::loading::start_engine(engine_config, &listener, config.conn_limits).await? else {
        return Ok(());
    };
    let mut state = AppState::with_config(engine.clone(), config);
    state.backend = crate::backend::choice::choose(&engine, args, &state.metrics.registry)?;
    serve_state(state, tokio::net::TcpListener::from_std(listener)?).await
}

/// Binds `host:port` and serves until SIGINT / SIGTERM, then drains
/// ([`crate::shutdown`]).
pub async fn serve(engine: EngineHandle, host: &str, port: u16, config: ServerConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((host, port)).await.map_err(|e| anyhow::anyhow!("cannot bind {host}:{port}: {e}"))?;
    serve_state(AppState::with_config(engine, config), listener).await
}

async fn serve_state(state: AppState, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let engine = state.engine.clone();
    let config = (*state.config).clone();
    let info = engine.info();
    tracing::info!(
        addr = %listener.local_addr()?, role = state.backend.role().as_str(), model = %info.id, max_model_len = info.max_model_len,
        num_kv_blocks = info.num_kv_blocks, block_size = info.block_size,
        api_key = !config.api_keys.is_empty(), cluster_token = config.cluster_token.is_some(),
        max_concurrent_requests = config.max_concurrent_requests, max_queued_requests = config.max_queued_requests,
        "kvc-server listening"
    );
    if let Some(w) = exposure_warning(&listener.local_addr()?, !config.api_keys.is_empty()) {
        tracing::warn!(addr = %listener.local_addr()?, "{w}");
    }
    let (shutdown_timeout, limits) = (config.shutdown_timeout, config.conn_limits);
    let lifecycle = state.lifecycle.clone();
    crate::shutdown::serve_until(listener, router(state), lifecycle, shutdown_timeout, limits, crate::shutdown::signal()).await?;
    Ok(())
}
