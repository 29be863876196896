//! Shared state, the router, and serving.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::Router;
use kvc_engine::EngineHandle;

use crate::error::ApiError;

/// Largest request body accepted (vLLM has no limit; 16 MiB holds a
/// ~4M-token prompt).
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// How long a shutdown waits for open responses (e.g. streams) to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Server-side counters exported by `/metrics` next to the engine's.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Requests handed to the engine on the `local` path (single worker).
    pub local_requests: AtomicU64,
    /// Streams whose client went away before the end (cancelled).
    pub streams_cancelled: AtomicU64,
}

impl ServerCounters {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub struct AppState {
    pub engine: EngineHandle,
    pub counters: Arc<ServerCounters>,
}

impl AppState {
    pub fn new(engine: EngineHandle) -> Self {
        Self { engine, counters: Arc::new(ServerCounters::default()) }
    }

    /// The name clients must use in `model`.
    pub fn model_name(&self) -> &str {
        &self.engine.info().id
    }

    /// `model` is optional (as in vLLM); when given it must be ours.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            Some(m) if m != self.model_name() => Err(ApiError::ModelNotFound { model: m.to_string() }),
            _ => Ok(()),
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/completions", post(crate::completions::completions))
        .route("/v1/models", get(crate::models::list_models))
        .route("/v1/models/{model}", get(crate::models::get_model))
        .route("/health", get(crate::health::health))
        .route("/metrics", get(crate::metrics::metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NoRoute { method: method.to_string(), path: uri.path().to_string() }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }
}

/// Binds `host:port` and serves until Ctrl-C or SIGTERM.
pub async fn serve(engine: EngineHandle, host: &str, port: u16) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind {host}:{port}: {e}"))?;
    let info = engine.info();
    tracing::info!(
        addr = %listener.local_addr()?, model = %info.id, max_model_len = info.max_model_len,
        num_kv_blocks = info.num_kv_blocks, block_size = info.block_size, "kvc-server listening"
    );
    let app = router(AppState::new(engine));
    let stopping = Arc::new(tokio::sync::Notify::new());
    let notify = stopping.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        notify.notify_one();
    });
    tokio::select! {
        r = server => r?,
        _ = async { stopping.notified().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!(grace_s = SHUTDOWN_GRACE.as_secs(), "open responses did not finish in time; exiting");
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

