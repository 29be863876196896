//! Where the router sends a request: the score and the choice live in
//! `kvc-policy` ([`kvc_policy::route_score`], issue 32), re-exported here
//! so callers keep `kvc_disagg::routing::choose_worker`; this adds the view
//! of a polled worker ([`worker_view`]).

pub use kvc_policy::route_score::*;

use crate::protocol::WorkerState;

/// The view of a polled worker for a request of `session` (matched
/// exactly).
pub fn worker_view(state: &WorkerState, healthy: bool, session: Option<&str>) -> WorkerView {
    WorkerView {
        healthy: healthy && state.ready,
        block_size: state.block_size,
        total_blocks: state.total_blocks,
        free_blocks: state.free_blocks,
        evictable_blocks: state.evictable_blocks,
        active: state.running + state.waiting,
        resident_tokens: session.and_then(|id| state.sessions.get(id)).copied().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_not_ready_is_unhealthy() {
        let state = WorkerState { ready: false, block_size: 16, total_blocks: 10, free_blocks: 10, ..Default::default() };
        assert!(!worker_view(&state, true, None).healthy);
    }

    #[test]
    fn session_ids_match_exactly_never_by_prefix() {
        let mut a = WorkerState { ready: true, block_size: 16, total_blocks: 100, free_blocks: 100, ..Default::default() };
        a.sessions.insert("session-1".into(), 640);
        let b = WorkerState { ready: true, block_size: 16, total_blocks: 100, free_blocks: 100, ..Default::default() };
        let views = |id: &str| vec![worker_view(&b, true, Some(id)), worker_view(&a, true, Some(id))];
        let request = RouteRequest { prompt_tokens: 700, max_tokens: 16, home: None };
        let choose = |id: &str| choose_worker(&request, &views(id), &RouteWeights::default());
        // `session-12` is a different session: nothing resident anywhere.
        let d = choose("session-12");
        assert_eq!((d.worker, d.reason, d.home), (Some(0), RouteReason::LeastCost, None));
        assert_eq!(views("session-12")[1].resident_tokens, 0);
        assert_eq!(views("session-")[1].resident_tokens, 0);
        let d = choose("session-1");
        assert_eq!((d.worker, d.reason, d.home), (Some(1), RouteReason::SessionResident, Some(1)));
    }
}
