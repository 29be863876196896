//! The engine loop's side of KV handoff ([`crate::kv_handoff`] holds the
//! types callers see; docs/disaggregation.md the protocol): the commands for
//! reservations for remote prefills, leases on blocks being transferred,
//! snapshot jobs after committed turns, and the prefill worker's snapshot
//! store commands.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvc_kv_pool::BlockId;
use kvc_scheduler::SeqId;
use kvc_session_cache::hash_blocks;

use super::{Command, EngineLoop};
use crate::kv_handoff::{KvLease, SnapshotJob, SnapshotSlot};
use crate::EngineError;

/// What a reservation answers.
#[derive(Debug)]
pub(crate) struct Reserved {
    pub held_tokens: usize,
    pub reuse_reason: kvc_session_cache::ReusePath,
    pub restored_blocks: usize,
    pub blocks: Vec<BlockId>,
}

/// A reservation waiting for its submission.
pub(super) struct ReservationState {
    pub(super) session: Option<String>,
    pub(super) blocks: Vec<BlockId>,
    pub(super) held: usize,
    pub(super) reason: kvc_session_cache::ReusePath,
    pub(super) restored: usize,
}

/// Blocks held for a transfer out of the pool.
pub(super) struct LeaseState {
    pub(super) blocks: Vec<BlockId>,
    /// The session the blocks belong to (snapshot pushes).
    pub(super) session: Option<String>,
    revoked: Arc<AtomicBool>,
}

/// A snapshot reservation whose pusher never committed or aborted.
pub(super) const SNAPSHOT_RESERVATION_TTL: Duration = Duration::from_secs(120);

impl EngineLoop {
    /// Reservation, lease and snapshot-store commands.
    pub(super) fn handle_handoff(&mut self, cmd: Command) {
        match cmd {
            Command::Reserve { id, session, cache_salt, prompt, reply } => {
                let _ = reply.send(self.reserve(id, session, cache_salt.as_deref(), &prompt));
                self.publish();
            }
            Command::ReleaseReservation(id) => {
                if let Some(r) = self.reservations.remove(&id) {
                    self.allocator.free_all(&r.blocks);
                    if let Some(s) = r.session {
                        self.cache.abandon(&s);
                    }
                }
            }
            Command::ReleaseLease(id) => {
                if let Some(l) = self.leases.remove(&id) {
                    self.allocator.free_all(&l.blocks);
                }
            }
            Command::SnapshotReserve { session, tokens, reply } => {
                let _ = reply.send(self.snapshot_reserve(&session, tokens));
            }
            Command::SnapshotCommit { reservation, reply } => {
                let r = self.snapshots.commit(reservation, &mut self.allocator).map_err(|e| {
                    tracing::info!(event = "snapshot_commit_dropped", reservation, error = %e);
                    EngineError::UnknownReservation(reservation)
                });
                if let Ok(tokens) = r {
                    tracing::info!(event = "snapshot_ingested", reservation, tokens);
                }
                let _ = reply.send(r);
                self.publish();
            }
            Command::SnapshotAbort(id) => {
                self.snapshots.abort(id, &mut self.allocator);
            }
            Command::SnapshotPushed { session, ok } => {
                let kept = self.cache.session_info(&session).is_some();
                if let Some(p) = self.pushes.as_mut() {
                    p.finished(session, ok, kept);
                }
            }
            _ => unreachable!("not a handoff command"),
        }
    }

    /// Reserves a prompt's blocks: those the caches hold for it, and fresh
    /// ones for the rest.
    pub(super) fn reserve(
        &mut self,
        id: u64,
        session: Option<String>,
        cache_salt: Option<&str>,
        prompt: &[u32],
    ) -> Result<Reserved, EngineError> {
        let bs = self.block_size();
        let root = cache_salt.map(kvc_session_cache::salt_root);
        let got = self.cache.acquire(session.as_deref(), prompt, root, &mut self.allocator, &mut self.storage);
        let need = prompt.len().div_ceil(bs) - got.blocks.len();
        let Some(fresh) = self.cache.allocate(need, &mut self.allocator, &self.storage) else {
            self.allocator.free_all(&got.blocks);
            if let Some(s) = &session {
                self.cache.abandon(s);
            }
            return Err(EngineError::NoKvRoom(format!("{need} free blocks needed for the prompt, {} free", self.allocator.num_free())));
        };
        // A prefill worker writes the fresh blocks over the transport: copies
        // out of blocks an offload just freed must end first.
        self.cache.wait_host_copies();
        let mut blocks = got.blocks;
        blocks.extend(fresh);
        let reason = got.source;
        self.reservations
            .insert(id, ReservationState { session, blocks: blocks.clone(), held: got.tokens, reason, restored: got.restored_blocks });
        Ok(Reserved { held_tokens: got.tokens, reuse_reason: reason, restored_blocks: got.restored_blocks, blocks })
    }

    pub(super) fn snapshot_reserve(&mut self, session: &str, tokens: Vec<u32>) -> Result<SnapshotSlot, EngineError> {
        if self.snapshots.capacity() == 0 {
            return Err(EngineError::NoKvRoom("this worker keeps no snapshot store".into()));
        }
        // Room the store may take from the prefix cache.
        let need = tokens.len() / self.block_size();
        if self.allocator.num_free() < need {
            self.cache.reclaim(need, &mut self.allocator, &self.storage);
        }
        let r = self
            .snapshots
            .reserve(session, tokens, &mut self.allocator, &self.storage)
            .map_err(|e| EngineError::NoKvRoom(e.to_string()))?;
        Ok(SnapshotSlot { reservation: r.id, from_block: r.from_block, blocks: r.blocks })
    }

    /// A lease on `blocks` (new references, released with the lease).
    pub(super) fn lease(&mut self, blocks: Vec<BlockId>, session: Option<String>) -> KvLease {
        for &b in &blocks {
            self.allocator.incref(b);
        }
        let id = self.next_lease;
        self.next_lease += 1;
        let revoked = Arc::new(AtomicBool::new(false));
        self.leases.insert(id, LeaseState { blocks: blocks.clone(), session, revoked: revoked.clone() });
        KvLease::new(id, blocks, revoked, self.commands.clone())
    }

    /// Marks the leases of released sessions: their pushes are abandoned.
    pub(super) fn revoke_leases_of(&mut self, released: impl Fn(&str) -> bool) {
        for l in self.leases.values() {
            if l.session.as_deref().is_some_and(&released) && !l.revoked.swap(true, Ordering::AcqRel) {
                tracing::info!(event = "snapshot_push_revoked", session = ?l.session, "session released during its snapshot push");
            }
        }
    }

    /// After a committed turn: queue a push of the session's full blocks
    /// when enough of them are not yet snapshotted.
    pub(super) fn maybe_push_snapshot(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId]) {
        let bs = self.block_size();
        let full = (tokens.len() / bs).min(blocks.len());
        let Some(pushes) = self.pushes.as_ref() else {
            return;
        };
        let hashes = hash_blocks(&tokens[..full * bs], bs);
        let Some(same) = pushes.due(session, &hashes, bs) else {
            return;
        };
        let job_tokens = tokens[..full * bs].to_vec();
        let lease = self.lease(blocks[..full].to_vec(), Some(session.to_string()));
        let job = SnapshotJob { session_id: session.to_string(), tokens: job_tokens, lease };
        if self.pushes.as_mut().is_some_and(|p| p.send(job, hashes)) {
            self.local.snapshot_pushes_enqueued += 1;
            tracing::info!(event = "snapshot_push_enqueued", session, blocks = full, new_blocks = full - same);
        }
    }

    /// Prefill worker: leases a finished export's prompt blocks to the
    /// caller and keeps them as the session's snapshot.
    pub(super) fn export_prompt(&mut self, id: SeqId) -> Option<KvLease> {
        let a = self.active.get(&id).filter(|a| a.export)?;
        let seq = self.scheduler.get(id)?;
        let n = a.prompt_len;
        if seq.num_computed < n {
            return None;
        }
        let blocks = seq.block_table[..n.div_ceil(self.block_size())].to_vec();
        if let Some(s) = a.snapshot_session.clone() {
            let tokens = seq.tokens[..n].to_vec();
            self.snapshots.ingest_local(&s, &tokens, &blocks, &mut self.allocator, &self.storage);
        }
        Some(self.lease(blocks, None))
    }
}
