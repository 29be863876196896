//! Host-memory tier: whole blocks (every layer's K and V) copied out of the
//! pool into a [`HostArena`], bounded in slots. The arena decides how the
//! bytes move (at once for a host pool; queued on a copy stream for a GPU
//! pool): the tier hands out slots and calls [`HostTier::flush`] when a
//! batch of moves is complete.
//!
//! One arena per engine, shared: a [`HostTier`] is a handle, and its clones
//! reach the same slots. A prefill worker's [`crate::SessionAwareCache`]
//! and its [`crate::SnapshotStore`] both spill into it. A slot belongs to
//! whichever of them stored into it, and only its owner releases or
//! restores it: when the arena is full, each side makes room by dropping
//! its own coldest host-resident KV, never the other's (first come, first
//! served; on a prefill worker the cache keeps no sessions, so the store
//! has the arena to itself in practice).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use kvc_kv_pool::{BlockId, CopyTicket, HostArena, HostSlot, KvStorage, VecArena};

pub type HostBlockId = HostSlot;

struct Inner {
    arena: Box<dyn HostArena>,
    free: Vec<HostBlockId>,
    /// Pool blocks stored from since the last wait on the arena: copies
    /// out of them may still be reading them.
    copied_from: HashSet<BlockId>,
}

/// A handle on the engine's host tier (clones share it).
#[derive(Clone)]
pub struct HostTier {
    inner: Arc<Mutex<Inner>>,
}

impl HostTier {
    /// A tier of plain host vectors (for a pool in host memory).
    pub fn new(capacity_blocks: usize) -> Self {
        Self::with_arena(Box::new(VecArena::new(capacity_blocks)))
    }

    pub fn with_arena(arena: Box<dyn HostArena>) -> Self {
        // Slots are handed out lowest first, so a session's blocks land in
        // consecutive slots and their copies coalesce.
        let free = (0..arena.capacity() as HostBlockId).rev().collect();
        Self { inner: Arc::new(Mutex::new(Inner { arena, free, copied_from: HashSet::new() })) }
    }

    /// The tier's state. Only the engine thread uses it: never contended.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.lock().arena.capacity()
    }

    pub fn num_free(&self) -> usize {
        self.lock().free.len()
    }

    /// Copies a device block into the tier; None when the tier is full.
    pub fn store(&mut self, storage: &KvStorage, block: BlockId) -> Option<HostBlockId> {
        let mut t = self.lock();
        let slot = t.free.pop()?;
        t.arena.store(storage, block, slot);
        t.copied_from.insert(block);
        Some(slot)
    }

    /// Copies a stored block back into device block `dst` and frees the slot.
    pub fn restore(&mut self, storage: &mut KvStorage, slot: HostBlockId, dst: BlockId) {
        let mut t = self.lock();
        t.arena.load(storage, slot, dst);
        t.free.push(slot);
    }

    pub fn release(&mut self, slot: HostBlockId) {
        self.lock().free.push(slot);
    }

    /// Issues the copies queued since the last flush (see [`HostArena::flush`]).
    pub fn flush(&mut self) {
        self.lock().arena.flush();
    }

    /// Flushes, then, if any of `blocks` was stored from since the last
    /// wait, blocks until the arena's copies are done: before those blocks
    /// go to a writer the arena's ordering does not cover (a peer's
    /// transfer). Blocks no copy reads go at once, whatever other copies
    /// (a write-back batch of idle sessions, say) are still running.
    pub fn wait_for(&mut self, blocks: &[BlockId]) {
        let mut t = self.lock();
        t.arena.flush();
        if blocks.iter().any(|b| t.copied_from.contains(b)) {
            t.arena.wait_all();
            t.copied_from.clear();
        }
    }

    /// Issues the queued copies without making later compute wait for
    /// them ([`HostArena::flush_async`]).
    pub fn flush_async(&mut self) -> CopyTicket {
        self.lock().arena.flush_async()
    }

    /// Whether the copies of `ticket` are done.
    pub fn done(&mut self, ticket: CopyTicket) -> bool {
        self.lock().arena.done(ticket)
    }

    /// Blocks until the copies of `ticket` are done.
    pub fn wait(&mut self, ticket: CopyTicket) {
        self.lock().arena.wait(ticket)
    }

    /// Whether copies run beside compute ([`HostArena::asynchronous`]).
    pub fn asynchronous(&self) -> bool {
        self.lock().arena.asynchronous()
    }

    /// Bytes moved so far: (to host, back to the pool).
    pub fn bytes_moved(&self) -> (u64, u64) {
        self.lock().arena.bytes_moved()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_arena_and_its_slots() {
        let a = HostTier::new(3);
        let b = a.clone();
        let layout = kvc_kv_pool::KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 2, block_size: 2, dtype: candle_core::DType::F32 };
        let storage = KvStorage::new(layout, 2).unwrap();
        let (mut a, mut b) = (a, b);
        let s = a.store(&storage, 0).unwrap();
        assert_eq!((a.num_free(), b.num_free()), (2, 2));
        b.store(&storage, 1).unwrap();
        b.store(&storage, 1).unwrap();
        assert!(a.store(&storage, 0).is_none(), "full for every holder");
        a.release(s);
        assert_eq!(b.num_free(), 1);
        assert_eq!(a.bytes_moved(), b.bytes_moved());
    }

    #[test]
    fn a_wait_for_blocks_waits_only_when_a_copy_reads_one_of_them() {
        let arena = crate::test_arena::TestArena::new(4);
        let waits = arena.waits.clone();
        let n = || waits.load(std::sync::atomic::Ordering::Relaxed);
        let mut t = HostTier::with_arena(Box::new(arena));
        let layout = kvc_kv_pool::KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 2, block_size: 2, dtype: candle_core::DType::F32 };
        let storage = KvStorage::new(layout, 4).unwrap();
        t.wait_for(&[0, 1]);
        assert_eq!(n(), 0, "nothing stored");
        t.store(&storage, 1).unwrap();
        t.store(&storage, 2).unwrap();
        t.wait_for(&[0, 3]);
        assert_eq!(n(), 0, "copies out of other blocks run on");
        let mut other = t.clone();
        other.wait_for(&[3, 2]);
        assert_eq!(n(), 1, "a copy out of block 2: wait, through any handle");
        t.wait_for(&[1, 2]);
        assert_eq!(n(), 1, "those copies were waited for already");
    }
}
