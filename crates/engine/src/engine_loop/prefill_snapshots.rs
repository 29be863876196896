//! The prefill worker's part of the loop: its snapshot store
//! (kvc_session_cache::SnapshotStore) of session KV pushed by decode
//! workers and kept from its own exports, reused by prefill bypass, and
//! spilling into the engine's one host tier. Absent on the other roles and
//! when `snapshot_store_blocks` is 0.

use std::time::Duration;

use kvc_kv_pool::{BlockAllocator, BlockId, KvStorage};
use kvc_session_cache::{BypassAsk, HostTier, SnapshotStore};

use super::apply_changes;
use super::role_parts::{Ctx, RolePart};
use crate::command::{Command, SnapshotSlot};
use crate::{EngineError, EngineStats};

/// A snapshot reservation whose pusher never committed or aborted.
const SNAPSHOT_RESERVATION_TTL: Duration = Duration::from_secs(120);

/// The store of `snapshot_store_blocks` ([`crate::config::HALF_THE_POOL`]:
/// half of `pool_blocks`), when that is not 0. It demotes into `host_tier`,
/// the session cache's (one host tier: host_tier.rs).
pub(super) fn part(block_size: usize, snapshot_store_blocks: usize, pool_blocks: usize, host_tier: HostTier) -> Option<Box<dyn RolePart>> {
    let capacity = match snapshot_store_blocks {
        crate::config::HALF_THE_POOL => pool_blocks / 2,
        n => n.min(pool_blocks),
    };
    if capacity == 0 {
        return None;
    }
    let mut store = SnapshotStore::new(block_size, capacity);
    store.set_host_tier(host_tier);
    Some(Box::new(PrefillSnapshots(store)))
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
        let r = self.0.reserve(session, tokens, ctx.alloc, ctx.storage).map_err(|e| EngineError::NoKvRoom(e.to_string()))?;
        Ok(SnapshotSlot { reservation: r.id, from_block: r.from_block, blocks: r.blocks })
    }
}

impl RolePart for PrefillSnapshots {
    fn expire(&mut self, alloc: &mut BlockAllocator) -> usize {
        self.0.expire_pending(SNAPSHOT_RESERVATION_TTL, alloc)
    }

    /// Snapshots give way to the prompts the worker must compute.
    fn reclaim(&mut self, need: usize, alloc: &mut BlockAllocator, storage: &KvStorage) {
        self.0.reclaim(need, alloc, storage);
    }

    fn delete_session(&mut self, session: &str, alloc: &mut BlockAllocator) -> bool {
        self.0.remove(session, alloc)
    }

    fn snapshot_covers(&self, session: &str, prompt: &[u32]) -> Option<usize> {
        Some(self.0.covered(session, prompt))
    }

    fn bypass_missed(&mut self, _session: &str) {
        self.0.missed();
    }

    /// Restored from the host tier first if the entry was demoted.
    fn reuse(&mut self, ask: BypassAsk, alloc: &mut BlockAllocator, storage: &mut KvStorage) -> Option<(Vec<BlockId>, usize)> {
        self.0.lookup(ask, alloc, storage)
    }

    /// An export's prompt becomes the session's snapshot when it covers more.
    fn exported(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], alloc: &mut BlockAllocator, storage: &KvStorage) {
        self.0.ingest_local(session, tokens, blocks, alloc, storage);
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
        stats.snapshot_host_blocks = self.0.host_blocks();
    }

    fn held_blocks(&self) -> usize {
        self.0.used_blocks()
    }
}
