//! Probes: `GET /health` is readiness (200 `{"status": "ready"}` while the
//! model is loaded, the engine thread runs and the server is not draining;
//! 503 otherwise), `GET /health/live` is liveness (200 while the process
//! serves HTTP at all). The server binds only after the engine has loaded
//! the model, so "loaded" needs no separate check.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::app::AppState;

/// The readiness decision alone.
pub fn readiness(engine_alive: bool, draining: bool) -> (StatusCode, Value) {
    if draining {
        (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "draining", "reason": "the server is shutting down"}))
    } else if !engine_alive {
        (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "engine_stopped", "reason": "the engine thread has exited"}))
    } else {
        (StatusCode::OK, json!({"status": "ready"}))
    }
}

pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let (status, body) = readiness(state.engine.is_alive(), state.lifecycle.is_draining());
    (status, Json(body))
}

pub async fn live() -> Json<Value> {
    Json(json!({"status": "alive"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_a_live_engine_and_not_draining() {
        assert_eq!(readiness(true, false), (StatusCode::OK, json!({"status": "ready"})));
        assert_eq!(readiness(false, false).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(readiness(false, false).1["status"], "engine_stopped");
        assert_eq!(readiness(true, true).1["status"], "draining");
    }
}
