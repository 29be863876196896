//! Worker-to-worker routes (`/internal/*`), behind `--cluster-token`
//! ([`crate::auth::require_cluster_token`]): a ping, the published worker
//! state the router and decode workers poll, and the prefill worker's
//! handshake, remote prefill and snapshot routes ([`crate::pd::prefill`]).

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::app::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/internal/ping", get(ping))
        .route("/internal/state", get(crate::worker_state::get_state))
        .route("/internal/kv/handshake", get(crate::pd::prefill::handshake))
        .route("/internal/prefill", post(crate::pd::prefill::remote_prefill))
        .route("/internal/snapshot/reserve", post(crate::pd::prefill::snapshot_reserve))
        .route("/internal/snapshot/commit", post(crate::pd::prefill::snapshot_commit))
        .route("/internal/snapshot/abort", post(crate::pd::prefill::snapshot_abort))
}

async fn ping(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"status": "ok", "model": state.model_name()}))
}
