//! Worker-to-worker routes (`/internal/*`), behind `--cluster-token`
//! ([`crate::auth::require_cluster_token`]). P/D endpoints go here; for now
//! a ping that proves the guard.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::app::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/internal/ping", get(ping))
        .route("/internal/state", get(crate::worker_state::get_state))
}

async fn ping(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"status": "ok", "model": state.model_name()}))
}
