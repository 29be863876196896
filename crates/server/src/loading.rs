//! The HTTP front while the engine loads (a hub download, tens of GB of
//! weights, the KV pool): the port is bound at once so that probes get an
//! answer, `/health/live` 200 (the process is up: do not restart it),
//! `/health` 503 `{"status": "loading"}` (do not send traffic yet), and
//! every other route 503 in OpenAI's error shape. When the engine is ready
//! this front stops and the full server takes the same socket.

use std::net::TcpListener;

use anyhow::Context;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use kvc_engine::{EngineConfig, EngineHandle};
use serde_json::{json, Value};

async fn not_ready() -> (StatusCode, Json<Value>) {
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading", "reason": "the model is still loading"})))
}

async fn loading_error() -> crate::error::ApiError {
    crate::error::ApiError::Unavailable("the model is still loading; retry when /health answers 200".into())
}

/// How long the probes' front waits for its requests in flight when the
/// engine is ready (they are probes: milliseconds).
const PROBE_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The routes served during the load.
pub fn loading_router() -> Router {
    Router::new().route("/health", get(not_ready)).route("/health/live", get(crate::health::live)).fallback(loading_error)
}

/// Starts the engine on a thread of its own and answers probes on
/// `listener` until it is ready, through the same accept loop as the full
/// server (its connection limits, protocol errors as error JSON). `None`:
/// a shutdown signal came first (the caller exits; the load thread ends
/// with the process).
pub async fn start_engine(
    config: EngineConfig,
    listener: &TcpListener,
    limits: crate::shutdown::ConnLimits,
) -> anyhow::Result<Option<EngineHandle>> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kvc-load".into())
        // A plain thread, not the runtime's: the hub download runs an async runtime of its own.
        .spawn(move || {
            let started = EngineHandle::start(config);
            if let Ok(engine) = &started {
                // Structured outputs' vocabulary index, built beside the first requests.
                engine.warm_grammar_compiler();
            }
            let _ = ready_tx.send(started);
        })
        .context("cannot start the load thread")?;
    let probes = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let front = tokio::spawn(async move {
        let open = crate::shutdown::accept_until(probes, loading_router(), limits, async {
            let _ = stop_rx.await;
        })
        .await;
        let _ = tokio::time::timeout(PROBE_DRAIN, open.shutdown()).await;
    });
    let outcome = tokio::select! {
        r = ready_rx => Some(r),
        _ = crate::shutdown::signal() => None,
    };
    let _ = stop_tx.send(());
    let _ = front.await;
    match outcome {
        None => {
            tracing::info!("shutdown signal while loading: exiting");
            Ok(None)
        }
        Some(Ok(started)) => Ok(Some(started.context("cannot start the engine")?)),
        Some(Err(_)) => anyhow::bail!("the engine's load thread died before it finished"),
    }
}
