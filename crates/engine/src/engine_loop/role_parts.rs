//! The role-specific parts of the loop, behind one small trait. The core
//! loop (scheduler -> batch -> model -> sampler -> streams) owns a
//! [`RoleParts`] and calls its hooks at fixed points without knowing which
//! role it serves: a prefill worker's part is its snapshot store
//! (`prefill_snapshots.rs`), a decode worker's its snapshot pushes
//! (`snapshot_pushes.rs`); role `both` has none, and every hook is then a
//! no-op. Which parts exist is decided once, from the configuration
//! (`snapshot_store_blocks`, `snapshot_min_tokens`), the way TGI picks its
//! block allocator once at start.

use kvc_kv_pool::{BlockAllocator, BlockId, KvStorage};
use kvc_session_cache::{BypassAsk, SessionAwareCache};

use super::handoff_commands::Leases;
use crate::command::Command;
use crate::{EngineError, EngineStats};

/// What a part may touch when a hook needs more than the allocator.
pub(super) struct Ctx<'a> {
    pub alloc: &'a mut BlockAllocator,
    pub cache: &'a mut SessionAwareCache,
    pub storage: &'a KvStorage,
    /// Leases on blocks for transfers out of the pool.
    pub leases: &'a mut Leases,
}

/// One role's part of the loop. Every hook defaults to doing nothing.
pub(super) trait RolePart: Send {
    /// Once a second: drops what timed out; returns how many things it dropped.
    fn expire(&mut self, _alloc: &mut BlockAllocator) -> usize {
        0
    }

    /// The scheduler still lacks `need` free blocks after the caches gave theirs.
    fn reclaim(&mut self, _need: usize, _alloc: &mut BlockAllocator, _storage: &KvStorage) {}

    /// A session was deleted; true if this part held something of it.
    fn delete_session(&mut self, _session: &str, _alloc: &mut BlockAllocator) -> bool {
        false
    }

    /// Leading tokens of a prompt of `session` that [`Self::reuse`] would
    /// serve (before any restore); None when this part keeps no snapshots.
    fn snapshot_covers(&self, _session: &str, _prompt: &[u32]) -> Option<usize> {
        None
    }

    /// A prompt of `session` was served without this part's KV, which
    /// covered too little (prefill bypass missed).
    fn bypass_missed(&mut self, _session: &str) {}

    /// KV this part holds for what a prefill bypass asks: new references
    /// on the blocks, and the leading tokens they cover.
    fn reuse(&mut self, _ask: BypassAsk, _alloc: &mut BlockAllocator, _storage: &mut KvStorage) -> Option<(Vec<BlockId>, usize)> {
        None
    }

    /// A prefill request's prompt of `session` was computed and exported.
    fn exported(&mut self, _session: &str, _tokens: &[u32], _blocks: &[BlockId], _alloc: &mut BlockAllocator, _storage: &KvStorage) {}

    /// A turn of `session` was committed with these tokens and blocks;
    /// true if that handed a snapshot push on.
    fn committed(&mut self, _session: &str, _tokens: &[u32], _blocks: &[BlockId], _ctx: Ctx<'_>) -> bool {
        false
    }

    /// Whether `cmd` is this part's own (then [`Self::on_command`] gets it).
    fn takes(&self, _cmd: &Command) -> bool {
        false
    }

    /// One of this part's commands; returns whether the loop should publish.
    fn on_command(&mut self, _cmd: Command, _ctx: Ctx<'_>) -> bool {
        false
    }

    /// Writes this part's state into the stats about to be published.
    fn publish(&mut self, _stats: &mut EngineStats) {}

    /// Blocks this part holds (a prefix-cache reset leaves them).
    fn held_blocks(&self) -> usize {
        0
    }
}

/// The parts of the role this loop serves (none for role `both`).
#[derive(Default)]
pub(super) struct RoleParts(Vec<Box<dyn RolePart>>);

impl RoleParts {
    pub(super) fn new(parts: Vec<Box<dyn RolePart>>) -> Self {
        Self(parts)
    }

    pub(super) fn expire(&mut self, alloc: &mut BlockAllocator) -> usize {
        self.0.iter_mut().map(|p| p.expire(alloc)).sum()
    }

    pub(super) fn reclaim(&mut self, need: usize, alloc: &mut BlockAllocator, storage: &KvStorage) {
        for p in &mut self.0 {
            p.reclaim(need, alloc, storage);
        }
    }

    pub(super) fn delete_session(&mut self, session: &str, alloc: &mut BlockAllocator) -> bool {
        self.0.iter_mut().fold(false, |held, p| p.delete_session(session, alloc) | held)
    }

    pub(super) fn snapshot_covers(&self, session: &str, prompt: &[u32]) -> Option<usize> {
        self.0.iter().find_map(|p| p.snapshot_covers(session, prompt))
    }

    pub(super) fn bypass_missed(&mut self, session: &str) {
        for p in &mut self.0 {
            p.bypass_missed(session);
        }
    }

    pub(super) fn reuse(&mut self, ask: BypassAsk, alloc: &mut BlockAllocator, storage: &mut KvStorage) -> Option<(Vec<BlockId>, usize)> {
        self.0.iter_mut().find_map(|p| p.reuse(ask, alloc, storage))
    }

    pub(super) fn exported(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], alloc: &mut BlockAllocator, storage: &KvStorage) {
        for p in &mut self.0 {
            p.exported(session, tokens, blocks, alloc, storage);
        }
    }

    pub(super) fn committed(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], ctx: Ctx<'_>) -> bool {
        let Ctx { alloc, cache, storage, leases } = ctx;
        self.0.iter_mut().fold(false, |pushed, p| p.committed(session, tokens, blocks, Ctx { alloc, cache, storage, leases }) | pushed)
    }

    /// Hands a role command to the part it belongs to; a command no part
    /// takes is answered as a worker without that part answers it. Returns
    /// whether the loop should publish.
    pub(super) fn on_command(&mut self, cmd: Command, ctx: Ctx<'_>) -> bool {
        if let Some(p) = self.0.iter_mut().find(|p| p.takes(&cmd)) {
            return p.on_command(cmd, ctx);
        }
        match cmd {
            Command::SnapshotReserve { reply, .. } => {
                let _ = reply.send(Err(EngineError::NoKvRoom("this worker keeps no snapshot store".into())));
                false
            }
            Command::SnapshotCommit { reservation, reply } => {
                let e = kvc_session_cache::SnapshotError::UnknownReservation(reservation);
                tracing::info!(event = "snapshot_commit_dropped", reservation, error = %e);
                let _ = reply.send(Err(EngineError::UnknownReservation(reservation)));
                true
            }
            _ => false,
        }
    }

    pub(super) fn publish(&mut self, stats: &mut EngineStats) {
        for p in &mut self.0 {
            p.publish(stats);
        }
    }

    pub(super) fn held_blocks(&self) -> usize {
        self.0.iter().map(|p| p.held_blocks()).sum()
    }
}
