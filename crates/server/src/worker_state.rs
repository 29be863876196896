//! `GET /internal/state`: this worker's published state for the router and
//! for peers (see `kvc_disagg::protocol::WorkerState`). Read from the
//! engine's arc-swap snapshot only.

use axum::extract::State;
use axum::Json;
use kvc_disagg::protocol::WorkerState;

use crate::args::Role;
use crate::state::AppState;

/// The state a worker of `role` publishes (`ready`: its readiness,
/// [`crate::health::ready`]).
pub fn published(state: &AppState, role: Role, ready: bool) -> WorkerState {
    let s = state.engine.snapshot();
    let info = state.engine.info();
    WorkerState {
        role: role.as_str().to_string(),
        model: info.id.clone(),
        ready,
        block_size: info.block_size,
        total_blocks: s.total_blocks,
        free_blocks: s.free_blocks,
        evictable_blocks: s.evictable_blocks,
        running: s.running,
        waiting: s.waiting,
        sessions: s.sessions.iter().map(|(id, i)| (id.clone(), i.resident_tokens)).collect(),
        snapshots: s.snapshots.iter().map(|(id, i)| (id.clone(), i.tokens)).collect(),
        prefill_tokens_per_s: s.prefill_tokens_per_s,
        pending_prefill_tokens: state.engine.pending_prefill_tokens(),
    }
}

pub async fn get_state(State(state): State<AppState>) -> Json<WorkerState> {
    let ready = crate::health::ready(&state).0.is_success();
    Json(published(&state, state.backend.role(), ready))
}
