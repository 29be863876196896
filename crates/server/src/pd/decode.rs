//! A decode worker's way of starting a request: reserve the prompt's
//! blocks, decide where the missing suffix is computed
//! ([`kvc_disagg::prefill_path::decide`]), and either compute it here or
//! have a prefill worker compute it into the reserved blocks. Any failure
//! of the remote path falls back to computing here, into the same blocks:
//! the answer does not change, the fallback is counted.

use std::time::{Duration, Instant};

use kvc_disagg::prefill_path::{
    decide, decide_before_reservation, decide_fallback, decide_unreserved, PathDecision, PathInputs, PathReason, PeerView,
    PreReservationInputs, PrefillPath,
};
use kvc_disagg::protocol::{RemotePrefillRequest, RemotePrefillResponse};
use kvc_engine::{EngineHandle, GenerateRequest, RequestStream, Reservation, ReusePath, ServePath};

use super::PdState;
use crate::error::ApiError;
use crate::prompt_route::{Route, RouteReason};

/// Starts `req` on this decode worker.
pub async fn start(engine: &EngineHandle, pd: &PdState, mut req: GenerateRequest) -> Result<(RequestStream, Route), ApiError> {
    let info = engine.info();
    let n = req.prompt_tokens.len();
    let peer = pd.peers.pick(req.session_id.as_deref());
    // Without a session or peer, a prompt below the threshold cannot go
    // remote: skip the reservation round trip.
    let pre = PreReservationInputs {
        peer: peer.is_some(),
        prompt_tokens: n,
        min_remote_tokens: pd.config.min_remote_tokens,
        has_session: req.session_id.is_some(),
    };
    if let Some(d) = decide_before_reservation(&pre) {
        return local(engine, req, &d);
    }
    let reservation = match engine.reserve(req.session_id.as_deref(), req.cache_salt.as_deref(), &req.prompt_tokens).await {
        Ok(r) => r,
        Err(e) => {
            // The scheduler can still serve it (it preempts or waits).
            tracing::info!(event = "reserve_failed", error = %e);
            return local(engine, req, &decide_unreserved(n));
        }
    };
    let snap = engine.snapshot();
    let peer = peer.expect("checked above");
    let view = PeerView {
        healthy: peer.healthy,
        queued_requests: peer.state.as_ref().map_or(0, |s| s.running + s.waiting),
        prefill_tokens_per_s: peer.state.as_ref().map_or(0.0, |s| s.prefill_tokens_per_s),
        pending_prefill_tokens: pd.peers.backlog(&peer),
        snapshot_tokens: req.session_id.as_ref().and_then(|s| peer.state.as_ref()?.snapshots.get(s).copied()).unwrap_or(0),
    };
    let inputs = PathInputs {
        prompt_tokens: n,
        held_tokens: reservation.held_tokens,
        session_hit: reservation.reuse_reason == ReusePath::SessionHit,
        running: snap.running,
        local_tokens_per_s: snap.prefill_tokens_per_s,
        local_mixed_tokens_per_s: snap.mixed_prefill_tokens_per_s,
        local_pending_tokens: engine.pending_prefill_tokens(),
        kv_bytes_per_token: (info.kv_layout.bytes_per_block() / info.block_size.max(1)) as u64,
        transfer_bytes_per_s: match pd.link.bandwidth() {
            b if b > 0.0 => b,
            _ => 1e9,
        },
        round_trip_s: pd.remote_overhead_s(),
        min_remote_tokens: pd.config.min_remote_tokens,
        policy: pd.config.policy,
        peer: Some(view),
    };
    let d = decide(&inputs);
    count_path(&d);
    tracing::info!(
        event = "prefill_path", request_id = %req.request_id, path = d.path.as_str(), reason = d.reason.as_str(),
        prompt_tokens = n, held_tokens = reservation.held_tokens, snapshot_tokens = view.snapshot_tokens,
        est_local_ms = d.local_s * 1e3, est_remote_ms = d.remote_s * 1e3
    );
    if d.path != PrefillPath::Remote {
        let held = reservation.held_tokens;
        let stream = engine.submit_reserved(req, reservation, held, None).map_err(ApiError::completion_engine)?;
        return Ok((stream, Route { path: d.path.serve_path(), reason: Some(RouteReason::Path(d.reason)), ..Default::default() }));
    }
    // The first token is sampled on P: give it the seed D continues with.
    if req.sampling.seed.is_none() {
        req.sampling.seed = Some(rand::random());
    }
    let bs = info.block_size;
    let body = RemotePrefillRequest {
        request_id: req.request_id.clone(),
        session_id: req.session_id.clone(),
        cache_salt: req.cache_salt.clone(),
        prompt_tokens: req.prompt_tokens.clone(),
        sampling: req.sampling.clone(),
        skip_tokens: reservation.held_tokens,
        dst: pd.link.record().clone(),
        dst_blocks: reservation.blocks_to_fill(bs).to_vec(),
        budget_ms: pd.config.remote_prefill_budget.as_millis() as u64,
    };
    // Past this, P has stopped (its budget) and no write of it can land.
    let last_write = pd.config.remote_prefill_budget + pd.link.timeout + Duration::from_secs(2);
    let guard = Quarantine::new(reservation, last_write);
    // Until P answers, its backlog includes this (its reports lag).
    let _in_flight = pd.peers.dispatch(&peer, d.peer_tokens);
    let started = Instant::now();
    let sent = pd.client.post(&format!("{}/internal/prefill", peer.url)).json(&body).timeout(last_write).send().await;
    let answer: Result<RemotePrefillResponse, String> = match sent {
        Ok(r) if r.status().is_success() => r.json().await.map_err(|e| format!("bad answer: {e}")),
        Ok(r) => {
            let status = r.status();
            Err(format!("{status}: {}", r.text().await.unwrap_or_default()))
        }
        Err(e) => Err(e.to_string()),
    };
    let reservation = guard.defuse();
    match answer {
        Ok(a) => {
            pd.metrics.remote_prefill.with_label_values(&["ok"]).inc();
            pd.metrics.transfer_bytes.with_label_values(&["remote_prefill_received"]).inc_by(a.transfer_bytes as u64);
            let path = if a.bypass_tokens > 0 { ServePath::Bypass } else { ServePath::RemotePrefill };
            pd.observe_remote_overhead(started.elapsed().as_secs_f64() - (a.prefill_ms + a.transfer_ms) / 1e3);
            tracing::info!(
                event = "remote_prefill_ok", request_id = %req.request_id, path = path.as_str(), computed_on_peer = a.computed_tokens,
                bypass_tokens = a.bypass_tokens, transferred_tokens = a.transferred_tokens, prefill_ms = a.prefill_ms,
                transfer_ms = a.transfer_ms, total_ms = started.elapsed().as_secs_f64() * 1e3
            );
            let route = Route {
                path,
                reason: Some(RouteReason::Path(d.reason)),
                remote_computed_tokens: Some(a.computed_tokens),
                transferred_tokens: a.transferred_tokens,
            };
            let stream =
                engine.submit_reserved(req, reservation, n, Some((a.first_token, a.logprobs))).map_err(ApiError::completion_engine)?;
            Ok((stream, route))
        }
        Err(e) => {
            pd.metrics.remote_prefill.with_label_values(&["failed"]).inc();
            let (here, fallback) = decide_fallback(reservation.reuse_reason == ReusePath::SessionHit);
            kvc_policy::log_decision(&fallback);
            pd.peers.mark_failed(&peer.url, &format!("remote prefill failed: {e}"), &pd.metrics);
            tracing::warn!(event = "fallback", reason = fallback.reason.as_str(), request_id = %req.request_id, peer = %peer.url, error = %e, "computing locally instead");
            let held = reservation.held_tokens;
            let stream = engine.submit_reserved(req, reservation, held, None).map_err(ApiError::completion_engine)?;
            Ok((stream, Route { path: here.serve_path(), reason: Some(RouteReason::Fallback(fallback.reason)), ..Default::default() }))
        }
    }
}

/// A request computed here whatever the policy would say (`reason`:
/// several choices or prompts, computed once for all of them, or prompt
/// logprobs, which a remote prefill cannot return): counted and logged like
/// a decision.
pub fn computed_here(request_id: &str, reason: PathReason, choices: usize, prompt_tokens: usize) -> Route {
    let path = PrefillPath::Local;
    count_path(&PathDecision::without_estimates(path, reason, prompt_tokens));
    tracing::info!(event = "prefill_path", request_id, path = path.as_str(), reason = reason.as_str(), choices, prompt_tokens);
    Route { path: path.serve_path(), reason: Some(RouteReason::Path(reason)), ..Default::default() }
}

/// Counts a prefill-path decision (`kvc_decisions_total`) and logs it.
fn count_path(d: &PathDecision) {
    kvc_policy::log_decision(&d.decision());
}

fn local(engine: &EngineHandle, req: GenerateRequest, d: &PathDecision) -> Result<(RequestStream, Route), ApiError> {
    count_path(d);
    let stream = engine.submit(req).map_err(ApiError::completion_engine)?;
    Ok((stream, Route { path: d.path.serve_path(), reason: Some(RouteReason::Path(d.reason)), ..Default::default() }))
}

/// Holds a reservation while a prefill worker may write into it. If the
/// request is dropped meanwhile (the client went away), the blocks are
/// kept out of use until no write can still arrive, then released.
struct Quarantine {
    reservation: Option<Reservation>,
    hold: Duration,
}

impl Quarantine {
    fn new(reservation: Reservation, hold: Duration) -> Self {
        Self { reservation: Some(reservation), hold }
    }

    /// The peer answered (or failed for good): the blocks are safe to use.
    fn defuse(mut self) -> Reservation {
        self.reservation.take().expect("reservation present until defused")
    }
}

impl Drop for Quarantine {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            let hold = self.hold;
            tracing::info!(event = "reservation_quarantined", hold_s = hold.as_secs(), "request dropped during a remote prefill");
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    tokio::time::sleep(hold).await;
                    drop(r);
                });
            } else {
                std::mem::forget(r);
            }
        }
    }
}
