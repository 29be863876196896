//! Probes: `GET /health` is readiness (200 `{"status": "ready"}` while the
//! model is loaded, the engine thread runs, the engine is not stalled and
//! the server is not draining; 503 otherwise), `GET /health/live` is
//! liveness (200 while the process serves HTTP at all). The server binds
//! only after the engine has loaded the model, so "loaded" needs no
//! separate check. Stalled: requests have waited for [`STALLED_AFTER`] with
//! nothing scheduled (the engine's watchdog); a worker that cannot serve
//! what it queued is not ready for more.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::state::AppState;

/// How long the engine may be stalled (requests waiting, nothing
/// scheduled) before readiness fails: longer than any KV transfer's
/// timeout, the one legitimate cause.
pub const STALLED_AFTER: Duration = Duration::from_secs(60);

/// The readiness decision alone; `stalled_for`: how long the engine's
/// watchdog has seen requests wait with nothing scheduled.
pub fn readiness(engine_alive: bool, draining: bool, stalled_for: Option<Duration>) -> (StatusCode, Value) {
    if draining {
        (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "draining", "reason": "the server is shutting down"}))
    } else if !engine_alive {
        (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "engine_stopped", "reason": "the engine thread has exited"}))
    } else if let Some(d) = stalled_for.filter(|d| *d >= STALLED_AFTER) {
        let reason = format!("requests have waited {:.0} s with nothing scheduled (see kvc_engine_stalled_steps_total)", d.as_secs_f64());
        (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "stalled", "reason": reason}))
    } else {
        (StatusCode::OK, json!({"status": "ready"}))
    }
}

/// This worker's readiness ([`readiness`] of its engine and lifecycle).
pub fn ready(state: &AppState) -> (StatusCode, Value) {
    let stalled_for = state.engine.snapshot().stalled_since.map(|t| t.elapsed());
    readiness(state.engine.is_alive(), state.lifecycle.is_draining(), stalled_for)
}

pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let (status, body) = ready(&state);
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
        assert_eq!(readiness(true, false, None), (StatusCode::OK, json!({"status": "ready"})));
        assert_eq!(readiness(false, false, None).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(readiness(false, false, None).1["status"], "engine_stopped");
        assert_eq!(readiness(true, true, None).1["status"], "draining");
    }

    #[test]
    fn a_stalled_engine_is_not_ready_once_the_stall_outlasts_a_transfer() {
        assert_eq!(readiness(true, false, Some(Duration::from_secs(1))).0, StatusCode::OK);
        let (status, body) = readiness(true, false, Some(STALLED_AFTER));
        assert_eq!((status, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("stalled")));
    }
}
