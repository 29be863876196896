//! Prefill worker routes: remote prefills for decode workers (computing,
//! with prefill bypass from the snapshot store, then writing the KV into
//! the decode worker's blocks), snapshot pushes into the store, and the
//! snapshot probe.

use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::Json;
use kvc_disagg::protocol::{
    RemotePrefillRequest, RemotePrefillResponse, SnapshotCommitResponse, SnapshotFinishRequest, SnapshotReserveRequest,
    SnapshotReserveResponse, SnapshotStatus,
};
use kvc_disagg::HandshakeRecord;
use kvc_engine::{GenerateRequest, StreamEvent};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::{parse_json, JsonBody, OpenAiJson};
use crate::state::AppState;

macro_rules! json_body {
    ($($t:ty),*) => {$(
        impl JsonBody for $t {
            fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
                parse_json(bytes)
            }
        }
    )*};
}
json_body!(RemotePrefillRequest, SnapshotReserveRequest, SnapshotFinishRequest);

use super::PdState;

fn pd(state: &AppState) -> Result<&PdState, ApiError> {
    state.backend.disagg().ok_or_else(|| ApiError::bad_request("this worker takes no KV transfers (--role both)", None))
}

pub async fn handshake(State(state): State<AppState>) -> Result<Json<HandshakeRecord>, ApiError> {
    Ok(Json(pd(&state)?.link.record().clone()))
}

pub async fn remote_prefill(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<RemotePrefillRequest>,
) -> Result<Json<RemotePrefillResponse>, ApiError> {
    let pd = pd(&state)?;
    // Past the decode worker's budget, nothing may be written any more.
    let budget = Duration::from_millis(req.budget_ms);
    let deadline = Instant::now() + budget;
    let result = serve_prefill(&state, pd, req, deadline, budget).await;
    let outcome = if result.is_ok() { "ok" } else { "failed" };
    pd.metrics.remote_prefill_served.with_label_values(&[outcome]).inc();
    result.map(Json)
}

async fn serve_prefill(
    state: &AppState,
    pd: &PdState,
    req: RemotePrefillRequest,
    deadline: Instant,
    budget: Duration,
) -> Result<RemotePrefillResponse, ApiError> {
    let bs = state.engine.info().block_size;
    let n = req.prompt_tokens.len();
    if req.skip_tokens % bs != 0 || req.skip_tokens >= n || req.dst_blocks.len() != n.div_ceil(bs) - req.skip_tokens / bs {
        return Err(ApiError::bad_request(
            format!(
                "skip_tokens {} / {} dst_blocks do not fit a {n}-token prompt in blocks of {bs}",
                req.skip_tokens,
                req.dst_blocks.len()
            ),
            Some("dst_blocks"),
        ));
    }
    pd.link.record().check_compatible(&req.dst).map_err(|e| ApiError::bad_request(e.to_string(), Some("dst")))?;
    let started = Instant::now();
    let mut sampling = req.sampling.clone();
    sampling.max_tokens = 1;
    // Its one token is kept from the stop tokens as the decode worker's would be.
    sampling.min_tokens = sampling.min_tokens.min(1);
    let mut gen = GenerateRequest {
        request_id: req.request_id.clone(),
        prompt_tokens: req.prompt_tokens.clone(),
        sampling,
        session_id: req.session_id.clone(),
        cache_salt: req.cache_salt.clone(),
        grammar: None,
    };
    // The first token is masked by the same grammar the decode worker
    // uses; compiled off the async runtime.
    if let Some(c) = gen.sampling.constraint.clone() {
        let engine = state.engine.clone();
        let compiled = tokio::task::spawn_blocking(move || engine.compile_grammar(&c))
            .await
            .map_err(|e| ApiError::Internal(format!("grammar compilation failed: {e}")))?;
        gen.grammar = Some(compiled.map_err(ApiError::completion_engine)?);
    }
    let mut stream = state.engine.submit_export(gen).map_err(ApiError::completion_engine)?;
    let (mut first, mut logprobs, mut finished) = (None, None, None);
    let wait = tokio::time::timeout_at(deadline.into(), async {
        while let Some(ev) = stream.recv().await {
            match ev {
                StreamEvent::Token { token_id, logprobs: lp, .. } => {
                    if first.is_none() {
                        first = Some(token_id);
                        logprobs = lp;
                    }
                }
                StreamEvent::Finished { usage, export, .. } => {
                    finished = Some((usage, export));
                    break;
                }
                StreamEvent::Error(e) => return Err(ApiError::Internal(format!("prefill failed: {e}"))),
                StreamEvent::InvalidGrammar(e) => return Err(ApiError::bad_request(e, None)),
                // A remote prefill is never asked for them (decode.rs).
                StreamEvent::PromptLogprobs(_) => {}
            }
        }
        Ok(())
    })
    .await;
    match wait {
        Err(_) => return Err(ApiError::Timeout { timeout_s: budget.as_secs() }),
        Ok(r) => r?,
    }
    let (usage, lease) = finished.ok_or_else(|| ApiError::Internal("the engine ended the prefill without a result".into()))?;
    let lease = lease.ok_or_else(|| ApiError::Internal("the prefill's KV was not exported".into()))?;
    let first = first.ok_or_else(|| ApiError::Internal("the prefill produced no token".into()))?;
    let prefill_ms = started.elapsed().as_secs_f64() * 1e3;
    pd.hold_if_asked("remote_prefill").await;
    if Instant::now() > deadline {
        return Err(ApiError::Timeout { timeout_s: budget.as_secs() });
    }
    let src = lease.blocks()[req.skip_tokens / bs..].to_vec();
    let (link, dst, dst_blocks) = (pd.link.clone(), req.dst.clone(), req.dst_blocks.clone());
    let report = tokio::task::spawn_blocking(move || link.write(&dst, &src, &dst_blocks))
        .await
        .map_err(|e| ApiError::Internal(format!("transfer task failed: {e}")))?
        .map_err(|e| ApiError::Internal(format!("KV transfer to the decode worker failed: {e}")))?;
    drop(lease);
    pd.metrics.transfer_bytes.with_label_values(&["remote_prefill"]).inc_by(report.bytes as u64);
    let bypass = if usage.reuse_reason == kvc_engine::ReusePath::Bypass { usage.cached_tokens } else { 0 };
    if let Some(s) = &req.session_id {
        let hit = if bypass > 0 { "hit" } else { "miss" };
        pd.metrics.bypass.with_label_values(&[hit]).inc();
        tracing::info!(event = if bypass > 0 { "bypass_hit" } else { "bypass_miss" }, session = %s, bypass_tokens = bypass, prompt_tokens = n);
    }
    Ok(RemotePrefillResponse {
        first_token: first,
        logprobs,
        computed_tokens: usage.prompt_tokens - usage.cached_tokens,
        bypass_tokens: bypass,
        prefix_cached_tokens: usage.cached_tokens - bypass,
        transferred_tokens: n - req.skip_tokens,
        transfer_bytes: report.bytes,
        transfer_ms: report.elapsed.as_secs_f64() * 1e3,
        prefill_ms,
    })
}

pub async fn snapshot_reserve(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<SnapshotReserveRequest>,
) -> Result<Json<SnapshotReserveResponse>, ApiError> {
    let pd = pd(&state)?;
    pd.link.record().check_compatible(&req.src).map_err(|e| ApiError::bad_request(e.to_string(), Some("src")))?;
    let slot = state
        .engine
        .snapshot_reserve(&req.session_id, req.tokens)
        .await
        .map_err(|e| ApiError::Unavailable(format!("snapshot store: {e}")))?;
    pd.hold_if_asked("snapshot_reserve").await;
    Ok(Json(SnapshotReserveResponse {
        reservation: slot.reservation,
        from_block: slot.from_block,
        dst_blocks: slot.blocks,
        dst: pd.link.record().clone(),
    }))
}

pub async fn snapshot_commit(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<SnapshotFinishRequest>,
) -> Result<Json<SnapshotCommitResponse>, ApiError> {
    pd(&state)?;
    let tokens =
        state.engine.snapshot_commit(req.reservation).await.map_err(|e| ApiError::bad_request(e.to_string(), Some("reservation")))?;
    Ok(Json(SnapshotCommitResponse { tokens }))
}

pub async fn snapshot_abort(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<SnapshotFinishRequest>,
) -> Result<Json<Value>, ApiError> {
    pd(&state)?;
    state.engine.snapshot_abort(req.reservation);
    Ok(Json(json!({})))
}

/// `GET /v1/sessions/{id}/snapshot`: what this worker's snapshot store holds.
pub async fn snapshot_status(
    State(state): State<AppState>,
    tenant: crate::tenant::Tenant,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<crate::sessions::SaltQuery>,
) -> Json<SnapshotStatus> {
    let id = tenant.session(q.cache_salt.as_deref().filter(|s| !s.is_empty()), &id);
    let s = state.engine.snapshot();
    Json(match s.snapshots.get(&id) {
        Some(i) => SnapshotStatus {
            exists: true,
            tokens: i.tokens,
            age_s: i.updated.elapsed().as_secs_f64(),
            tier: Some(i.tier().as_str().to_string()),
        },
        None => SnapshotStatus { exists: false, tokens: 0, age_s: 0.0, tier: None },
    })
}
