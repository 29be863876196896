//! Worker-to-worker routes (`/internal/*`, listed in [`crate::routes`]),
//! behind `--cluster-token` ([`crate::auth::require_cluster_token`]): a
//! ping, the published worker state the router and decode workers poll
//! ([`crate::worker_state`]), and the prefill worker's handshake, remote
//! prefill and snapshot routes ([`crate::pd::prefill`]). This file holds
//! the ping.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::state::AppState;

pub async fn ping(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"status": "ok", "model": state.model_name()}))
}
