//! What the engine publishes after each step ([`EngineStats`]): its own
//! file so that the step loop, which writes it, and the handle, which
//! reads it, do not import each other for it.

use std::time::Instant;

use kvc_session_cache::{CacheStats, SessionInfo, SnapshotInfo, SnapshotStats};

/// The engine's state as of its last step: an immutable snapshot the step
/// loop publishes (arc-swap) so that probes, metrics and routing never enter
/// the loop.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub free_blocks: usize,
    pub total_blocks: usize,
    /// Blocks held only by caches (prefix index, idle sessions): reclaimable.
    pub evictable_blocks: usize,
    /// Blocks in the prefix index.
    pub cached_blocks: usize,
    pub host_free_blocks: usize,
    pub host_total_blocks: usize,
    /// Bytes the host tier has copied: (pool -> host, host -> pool).
    pub host_bytes_moved: (u64, u64),
    pub running: usize,
    pub waiting: usize,
    /// Prompt tokens admitted but not yet computed (the prefill backlog).
    pub pending_prefill_tokens: usize,
    pub steps: u64,
    pub preemptions: u64,
    pub prompt_tokens_computed: u64,
    pub generated_tokens: u64,
    /// Session hits, reuse, evictions by tier and reason, host restores.
    pub cache: CacheStats,
    /// Every session, a persistent map: publishing updates only the
    /// sessions that changed since the last step, and a clone is O(1).
    pub sessions: imbl::HashMap<String, SessionInfo>,
    /// Prefill workers: the snapshot store's entries (a persistent map kept
    /// from the changes, as `sessions`) and counters.
    pub snapshots: imbl::HashMap<String, SnapshotInfo>,
    pub snapshot_stats: SnapshotStats,
    pub snapshot_capacity_blocks: usize,
    /// Device blocks the store holds, and host-tier slots of its demoted entries.
    pub snapshot_used_blocks: usize,
    pub snapshot_host_blocks: usize,
    /// Decode workers: snapshot jobs handed to the pusher.
    pub snapshot_pushes_enqueued: u64,
    /// Measured prompt tokens per second of forward passes (moving
    /// average over steps with a sizeable prefill; 0 until measured).
    pub prefill_tokens_per_s: f64,
    /// Prompt tokens per second a prefill gets while decodes run (the
    /// decode-latency budget at its modelled step time; 0 until measured).
    pub mixed_prefill_tokens_per_s: f64,
    /// Prompt tokens per second the backlog has drained at while there was
    /// one (computed or found cached; decodes, waits and host work
    /// included: `kvc_policy::DrainRate`; 0 until measured). What a new
    /// prompt's wait is estimated from (`--max-queue-delay-s`).
    pub backlog_drain_tokens_per_s: f64,
    /// Seconds of prefill the next step may carry alone and beside
    /// decodes (None: no target, or not measured yet).
    pub step_budget: Option<(f64, f64)>,
    /// Step-kind decisions by (kind, reason) (`kvc_policy::step_kind`).
    pub step_kinds: Vec<((&'static str, &'static str), u64)>,
    /// Running sequences mid-prefill.
    pub partial_prefills: usize,
    /// Tokens computed again after preemption lost their KV.
    pub preempted_tokens_recomputed: u64,
    /// Scheduler admission decisions by reason (see kvc_scheduler::AdmitReason).
    pub admission_decisions: Vec<(&'static str, u64)>,
    /// Sequences admitted past an older one held back for memory (within
    /// the head-of-line bound).
    pub passed_head: u64,
    /// Steps in which requests waited and nothing was scheduled, by the
    /// reason the oldest waited ([`crate::stall_reasons`]); 0 in a healthy
    /// engine.
    pub stalled_steps: Vec<(&'static str, u64)>,
    /// Since when the engine has been stalled (None: it is stepping, or
    /// nothing waits).
    pub stalled_since: Option<Instant>,
    /// When the oldest request still waiting for admission was submitted.
    pub oldest_waiting_since: Option<Instant>,
    pub published_at: Option<Instant>,
    /// Structured outputs: grammar masks computed, the time spent computing
    /// them (beside the forward pass), and the time the step waited for
    /// them after the forward pass (their cost on the critical path).
    pub grammar_masks: u64,
    pub grammar_mask_seconds: f64,
    pub grammar_wait_seconds: f64,
    /// Requests ended because their grammar failed: a token it does not
    /// allow (from a prefill worker that ignored it) or a matcher error.
    pub grammar_errors: u64,
}
