//! A decode worker's background task pushing session snapshots to prefill
//! workers (docs/disaggregation.md): offer the session's full blocks, write
//! only the ones P lacks, commit. Never on a request's path; a session
//! released meanwhile aborts the push; every outcome is counted.

use std::sync::Arc;

use kvc_disagg::protocol::{SnapshotCommitResponse, SnapshotFinishRequest, SnapshotReserveRequest, SnapshotReserveResponse};
use kvc_engine::{EngineHandle, SnapshotJob};
use tokio::sync::mpsc;

use super::PdState;

pub async fn run(engine: EngineHandle, pd: Arc<PdState>, mut jobs: mpsc::UnboundedReceiver<SnapshotJob>) {
    while let Some(job) = jobs.recv().await {
        let session = job.session_id.clone();
        let result = push(&pd, job).await;
        match &result {
            Ok(tokens) => {
                pd.metrics.push_sent.inc();
                tracing::info!(event = "snapshot_push_sent", session = %session, tokens);
            }
            Err(reason) => {
                pd.metrics.push_failed.with_label_values(&[reason.0]).inc();
                tracing::warn!(event = "snapshot_push_failed", session = %session, reason = reason.0, detail = %reason.1);
            }
        }
        engine.snapshot_pushed(&session, result.is_ok());
    }
}

/// (counted reason, detail)
struct Failed(&'static str, String);

async fn push(pd: &PdState, job: SnapshotJob) -> Result<usize, Failed> {
    if job.lease.is_revoked() {
        return Err(Failed("session_released", String::new()));
    }
    let peer = pd.peers.pick(Some(&job.session_id)).filter(|p| p.healthy).ok_or(Failed("no_healthy_prefill_peer", String::new()))?;
    let offer = SnapshotReserveRequest { session_id: job.session_id.clone(), tokens: job.tokens.clone(), src: pd.link.record().clone() };
    let slot: SnapshotReserveResponse =
        call(pd, &format!("{}/internal/snapshot/reserve", peer.url), &offer).await.map_err(|e| Failed("reserve_failed", e))?;
    let finish = SnapshotFinishRequest { reservation: slot.reservation };
    let abort_url = format!("{}/internal/snapshot/abort", peer.url);
    let abort = |reason: &'static str, detail: String| {
        let (url, finish) = (abort_url.clone(), finish.clone());
        async move {
            let _ = pd.client.post(&url).json(&finish).send().await;
            Failed(reason, detail)
        }
    };
    let src = job.lease.blocks().get(slot.from_block..).map(<[u32]>::to_vec).unwrap_or_default();
    if src.len() != slot.dst_blocks.len() {
        return Err(abort("protocol_error", format!("{} blocks to send, {} slots", src.len(), slot.dst_blocks.len())).await);
    }
    if job.lease.is_revoked() {
        return Err(abort("session_released", String::new()).await);
    }
    let (link, dst, dst_blocks) = (pd.link.clone(), slot.dst.clone(), slot.dst_blocks.clone());
    let report = tokio::task::spawn_blocking(move || link.write(&dst, &src, &dst_blocks)).await;
    match report {
        Ok(Ok(r)) => pd.metrics.transfer_bytes.with_label_values(&["snapshot"]).inc_by(r.bytes as u64),
        Ok(Err(e)) => return Err(abort("transfer_failed", e.to_string()).await),
        Err(e) => return Err(abort("transfer_failed", e.to_string()).await),
    }
    // Released while the bytes were on the wire: P must not keep them.
    if job.lease.is_revoked() {
        return Err(abort("session_released", String::new()).await);
    }
    let done: SnapshotCommitResponse =
        call(pd, &format!("{}/internal/snapshot/commit", peer.url), &SnapshotFinishRequest { reservation: slot.reservation })
            .await
            .map_err(|e| Failed("commit_failed", e))?;
    Ok(done.tokens)
}

async fn call<B: serde::Serialize, R: serde::de::DeserializeOwned>(pd: &PdState, url: &str, body: &B) -> Result<R, String> {
    let r = pd.client.post(url).json(body).timeout(pd.link.timeout).send().await.map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        let status = r.status();
        return Err(format!("{status}: {}", r.text().await.unwrap_or_default()));
    }
    r.json().await.map_err(|e| e.to_string())
}
