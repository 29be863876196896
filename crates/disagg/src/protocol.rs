//! What workers and the router say to each other over HTTP (`/internal/*`,
//! behind `--cluster-token`). KV bytes never travel here: they go over the
//! Mooncake transport into blocks these messages name.
//!
//! Routes (served by `kvc-server`, see docs/disaggregation.md):
//!
//! | route | sent by | body -> answer |
//! |---|---|---|
//! | `GET /internal/state` | router, D (about P) | -> [`WorkerState`] |
//! | `GET /internal/kv/handshake` | any peer | -> [`HandshakeRecord`] of the worker's pool |
//! | `POST /internal/prefill` | D -> P | [`RemotePrefillRequest`] -> [`RemotePrefillResponse`] |
//! | `POST /internal/snapshot/reserve` | D -> P | [`SnapshotReserveRequest`] -> [`SnapshotReserveResponse`] |
//! | `POST /internal/snapshot/commit` | D -> P | [`SnapshotFinishRequest`] -> [`SnapshotCommitResponse`] |
//! | `POST /internal/snapshot/abort` | D -> P | [`SnapshotFinishRequest`] -> `{}` |
//!
//! The router drops a moved session's stale copy with the public
//! `DELETE /v1/sessions/{id}` (passing the client's `authorization`).

use std::collections::BTreeMap;

use kvc_wire::{Logprobs, SamplingParams};
use serde::{Deserialize, Serialize};

use crate::handshake::HandshakeRecord;

/// A worker's published state, read by the router (placement) and by
/// decode workers (a prefill worker's load). Built from the engine's
/// arc-swap snapshot; never enters the step loop.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerState {
    /// "both", "prefill" or "decode".
    pub role: String,
    pub model: String,
    /// False while draining or when the engine thread is gone.
    pub ready: bool,
    pub block_size: usize,
    pub total_blocks: usize,
    pub free_blocks: usize,
    /// Blocks held only by caches: reclaimable for new work.
    pub evictable_blocks: usize,
    pub running: usize,
    pub waiting: usize,
    /// Resident sessions and their resident tokens (any tier). Session ids
    /// are matched exactly.
    pub sessions: BTreeMap<String, usize>,
    /// Prefill workers: sessions with a snapshot and its tokens.
    pub snapshots: BTreeMap<String, usize>,
    /// Measured prompt tokens per second of this worker's forward passes
    /// (0 until measured).
    pub prefill_tokens_per_s: f64,
    /// Prompt tokens admitted here but not yet computed (its prefill
    /// backlog). Absent from older workers: 0.
    #[serde(default)]
    pub pending_prefill_tokens: usize,
}

impl WorkerState {
    /// Blocks this worker could give a new request now.
    pub fn available_blocks(&self) -> usize {
        self.free_blocks + self.evictable_blocks
    }
}

/// D asks P to compute a prompt and write its KV into D's blocks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemotePrefillRequest {
    pub request_id: String,
    /// For P's snapshot lookup (prefill bypass) and snapshot ingest.
    pub session_id: Option<String>,
    /// The request's cache salt: P's prefix cache is shared only within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    pub prompt_tokens: Vec<u32>,
    /// How P samples the first token. Carries an explicit seed so that D
    /// continues the same random stream.
    pub sampling: SamplingParams,
    /// Leading tokens whose KV D already holds (a multiple of the block
    /// size): P transfers only the blocks after them.
    pub skip_tokens: usize,
    /// D's pool.
    pub dst: HandshakeRecord,
    /// D's blocks for blocks `skip_tokens / block_size ..` of the prompt, in order.
    pub dst_blocks: Vec<u32>,
    /// P gives up (and writes nothing) once this long has passed since it
    /// received the request; D reuses the blocks only after this plus the
    /// transfer timeout.
    pub budget_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemotePrefillResponse {
    pub first_token: u32,
    pub logprobs: Option<Logprobs>,
    /// Prompt tokens P ran through the model.
    pub computed_tokens: usize,
    /// Prompt tokens whose KV came from P's snapshot store (prefill bypass).
    pub bypass_tokens: usize,
    /// Prompt tokens whose KV came from P's prefix cache.
    pub prefix_cached_tokens: usize,
    /// Tokens whose KV P wrote into D's blocks.
    pub transferred_tokens: usize,
    pub transfer_bytes: u64,
    pub transfer_ms: f64,
    pub prefill_ms: f64,
}

/// D offers P the full blocks of a session's committed tokens; P answers
/// from which block on it needs them (it may already hold a prefix).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotReserveRequest {
    pub session_id: String,
    /// Every token covered by the offered blocks (a whole number of blocks).
    pub tokens: Vec<u32>,
    /// D's pool (the source of the write).
    pub src: HandshakeRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotReserveResponse {
    /// Names the reservation in commit/abort.
    pub reservation: u64,
    /// First block P needs; blocks before it P already holds, verified
    /// token by token.
    pub from_block: usize,
    /// P's blocks for blocks `from_block..` (empty: nothing to send).
    pub dst_blocks: Vec<u32>,
    /// P's pool (the target of the write).
    pub dst: HandshakeRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotFinishRequest {
    pub reservation: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotCommitResponse {
    /// Tokens the session's snapshot covers now.
    pub tokens: usize,
}

/// `GET /v1/sessions/{id}/snapshot` on a prefill worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotStatus {
    pub exists: bool,
    pub tokens: usize,
    pub age_s: f64,
    /// Where an existing snapshot's blocks are: `device`, `host` (demoted
    /// to the host tier; still served, copied back first) or `mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}
