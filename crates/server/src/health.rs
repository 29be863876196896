//! `GET /health`: 200 once the engine runs (the server binds only after the
//! engine has loaded, so answering at all means ready).

use axum::Json;
use serde_json::{json, Value};

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}
