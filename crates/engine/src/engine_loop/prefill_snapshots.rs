//! The prefill worker's part of the loop: its snapshot store
//! (kvc_session_cache::SnapshotStore) of session KV pushed by decode
//! workers and kept from its own exports, reused by prefill bypass. Absent
//! on the other roles and when `snapshot_store_blocks` is 0.

use std::time::Duration;

use kvc_kv_pool::{BlockAllocator, BlockId};
use kvc_session_cache::SnapshotStore;

use super::role_parts::{Ctx, RolePart};
use super::{apply_changes, Command};
use crate::kv_handoff::SnapshotSlot;
use crate::{EngineError, EngineStats};

/// A snapshot reservation whose pusher never committed or aborted.
const SNAPSHOT_RESERVATION_TTL: Duration = Duration::from_secs(120);

/// The store of `snapshot_store_blocks` ([`crate::config::HALF_THE_POOL`]:
/// half of `pool_blocks`), when that is not 0.
pub(super) fn part(block_size: usize, snapshot_store_blocks: usize, pool_blocks: usize) -> Option<Box<dyn RolePart>> {
    let capacity = match snapshot_store_blocks {
        crate::config::HALF_THE_POOL => pool_blocks / 2,
        n => n.min(pool_blocks),
    };
    (capacity > 0).then(|| Box::new(PrefillSnapshots(SnapshotStore::new(block_size, capacity))) as Box<dyn RolePart>)
}

struct PrefillSnapshots(SnapshotStore);

impl PrefillSnapshots {
    /// Sets blocks aside for a push of `session`'s `tokens`, taking room
    /// from the prefix cache if the pool lacks it.
    fn reserve(&mut self, session: &str, tokens: Vec<u32>, ctx: Ctx<'_>) -> Result<SnapshotSlot, EngineError> {
        let need = tokens.len() / ctx.storage.layout().block_size;
        if ctx.alloc.num_free() < need {
            ctx.cache.reclaim(need, ctx.alloc, ctx.storage);
        }
        let r = self.0.reserve(session, tokens, ctx.alloc).map_err(|e| EngineError::NoKvRoom(e.to_string()))?;
        Ok(SnapshotSlot { reservation: r.id, from_block: r.from_block, blocks: r.blocks })
    }
}

impl RolePart for PrefillSnapshots {
    fn expire(&mut self, alloc: &mut BlockAllocator) -> usize {
        self.0.expire_pending(SNAPSHOT_RESERVATION_TTL, alloc)
    }

    /// Snapshots give way to the prompts the worker must compute.
    fn reclaim(&mut self, need: usize, alloc: &mut BlockAllocator) {
        self.0.reclaim(need, alloc);
    }

    fn delete_session(&mut self, session: &str, alloc: &mut BlockAllocator) -> bool {
        self.0.remove(session, alloc)
    }

    fn reuse(&mut self, session: &str, prompt: &[u32], alloc: &mut BlockAllocator) -> Option<(Vec<BlockId>, usize)> {
        self.0.lookup(session, prompt, alloc)
    }

    /// An export's prompt becomes the session's snapshot when it covers more.
    fn exported(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], alloc: &mut BlockAllocator) {
        self.0.ingest_local(session, tokens, blocks, alloc);
    }

    fn takes(&self, cmd: &Command) -> bool {
        matches!(cmd, Command::SnapshotReserve { .. } | Command::SnapshotCommit { .. } | Command::SnapshotAbort(_))
    }

    fn on_command(&mut self, cmd: Command, ctx: Ctx<'_>) -> bool {
        match cmd {
            Command::SnapshotReserve { session, tokens, reply } => {
                let _ = reply.send(self.reserve(&session, tokens, ctx));
                false
            }
            Command::SnapshotCommit { reservation, reply } => {
                let r = self.0.commit(reservation, ctx.alloc).map_err(|e| {
                    tracing::info!(event = "snapshot_commit_dropped", reservation, error = %e);
                    EngineError::UnknownReservation(reservation)
                });
                if let Ok(tokens) = r {
                    tracing::info!(event = "snapshot_ingested", reservation, tokens);
                }
                let _ = reply.send(r);
                true
            }
            Command::SnapshotAbort(id) => {
                self.0.abort(id, ctx.alloc);
                false
            }
            _ => false,
        }
    }

    fn publish(&mut self, stats: &mut EngineStats) {
        stats.snapshot_capacity_blocks = self.0.capacity();
        apply_changes(&mut stats.snapshots, self.0.take_changed());
        stats.snapshot_stats = self.0.stats.clone();
        stats.snapshot_used_blocks = self.0.used_blocks();
    }

    fn held_blocks(&self) -> usize {
        self.0.used_blocks()
    }
}
