//! Host-memory tier: whole blocks (every layer's K and V) copied out of the
//! pool into a [`HostArena`], bounded in slots. The arena decides how the
//! bytes move (at once for a host pool; queued on a copy stream for a GPU
//! pool): the tier hands out slots and calls [`HostTier::flush`] when a
//! batch of moves is complete.

use kvc_kv_pool::{BlockId, CopyTicket, HostArena, HostSlot, KvStorage, VecArena};

pub type HostBlockId = HostSlot;

pub struct HostTier {
    arena: Box<dyn HostArena>,
    free: Vec<HostBlockId>,
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
        Self { arena, free }
    }

    pub fn capacity(&self) -> usize {
        self.arena.capacity()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Copies a device block into the tier; None when the tier is full.
    pub fn store(&mut self, storage: &KvStorage, block: BlockId) -> Option<HostBlockId> {
        let slot = self.free.pop()?;
        self.arena.store(storage, block, slot);
        Some(slot)
    }

    /// Copies a stored block back into device block `dst` and frees the slot.
    pub fn restore(&mut self, storage: &mut KvStorage, slot: HostBlockId, dst: BlockId) {
        self.arena.load(storage, slot, dst);
        self.free.push(slot);
    }

    pub fn release(&mut self, slot: HostBlockId) {
        self.free.push(slot);
    }

    /// Issues the copies queued since the last flush (see [`HostArena::flush`]).
    pub fn flush(&mut self) {
        self.arena.flush();
    }

    /// Issues the queued copies without making later compute wait for
    /// them ([`HostArena::flush_async`]).
    pub fn flush_async(&mut self) -> CopyTicket {
        self.arena.flush_async()
    }

    /// Whether the copies of `ticket` are done.
    pub fn done(&mut self, ticket: CopyTicket) -> bool {
        self.arena.done(ticket)
    }

    /// Blocks until the copies of `ticket` are done.
    pub fn wait(&mut self, ticket: CopyTicket) {
        self.arena.wait(ticket)
    }

    /// Whether copies run beside compute ([`HostArena::asynchronous`]).
    pub fn asynchronous(&self) -> bool {
        self.arena.asynchronous()
    }

    /// Bytes moved so far: (to host, back to the pool).
    pub fn bytes_moved(&self) -> (u64, u64) {
        self.arena.bytes_moved()
    }
}
