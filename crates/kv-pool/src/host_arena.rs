//! Host memory that a host tier copies whole pool blocks into and back:
//! one slot holds one block of every layer (its K and V).
//!
//! Two kinds: [`VecArena`] for pools in host memory (copies happen at
//! once), and a pinned arena for GPU pools (`PinnedArena`, pinned_arena.rs,
//! built with the `cuda` feature), which queues the copies and issues them
//! on a copy stream of its own at [`HostArena::flush`].

use crate::{BlockId, KvStorage};

/// Index of a slot of a [`HostArena`].
pub type HostSlot = u32;

/// A batch of copies issued by [`HostArena::flush_async`], in issue order.
pub type CopyTicket = u64;

pub trait HostArena: Send {
    /// Slots in the arena.
    fn capacity(&self) -> usize;

    /// Copies every layer of pool block `block` into `slot`. The block may
    /// be reused after the next [`Self::flush`].
    fn store(&mut self, storage: &KvStorage, block: BlockId, slot: HostSlot);

    /// Copies `slot` back into pool block `block`. The block may be read
    /// after the next [`Self::flush`]; the slot may be stored into again.
    fn load(&mut self, storage: &mut KvStorage, slot: HostSlot, block: BlockId);

    /// Issues the queued copies, in order, and orders them (and every copy
    /// issued before, [`Self::flush_async`]'s included) before any later
    /// use of the pool. A no-op where copies happen at once.
    fn flush(&mut self) {}

    /// Issues the queued copies without ordering later use of the pool
    /// after them: the compute work does not wait. Until [`Self::done`]
    /// says so (or a [`Self::flush`] has followed), the blocks they read
    /// must not be rewritten and the blocks they write must not be read or
    /// written by anything else. [`Self::flush`] where copies happen at once.
    fn flush_async(&mut self) -> CopyTicket {
        self.flush();
        0
    }

    /// Whether the copies of `ticket` (and every batch before it) are done.
    fn done(&mut self, _ticket: CopyTicket) -> bool {
        true
    }

    /// Blocks the calling thread until the copies of `ticket` are done.
    fn wait(&mut self, _ticket: CopyTicket) {}

    /// Whether copies run beside the compute work (queued, issued at a
    /// flush) rather than when asked for: only then is copying ahead of
    /// need (write-back) or beside other work (restores) worth anything.
    fn asynchronous(&self) -> bool {
        false
    }

    /// Blocks until every issued copy is done: the host-side fence before a
    /// block that was stored from goes to a writer the arena's own ordering
    /// does not cover (a peer's transfer into the pool). A no-op where
    /// copies happen at once.
    fn wait_all(&mut self) {}

    /// Bytes copied to and from the arena so far: (stored, loaded).
    fn bytes_moved(&self) -> (u64, u64);
}

/// A host-memory arena of plain vectors, one per occupied slot, for pools
/// in host memory: each copy happens when it is asked for.
pub struct VecArena {
    slots: Vec<Option<Vec<u8>>>,
    moved: (u64, u64),
}

impl VecArena {
    pub fn new(capacity: usize) -> Self {
        Self { slots: vec![None; capacity], moved: (0, 0) }
    }
}

impl HostArena for VecArena {
    fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn store(&mut self, storage: &KvStorage, block: BlockId, slot: HostSlot) {
        let mut bytes = Vec::with_capacity(storage.layout().bytes_per_block());
        for layer in 0..storage.layout().num_layers {
            bytes.extend_from_slice(storage.block_bytes(layer, block));
        }
        self.moved.0 += bytes.len() as u64;
        self.slots[slot as usize] = Some(bytes);
    }

    fn load(&mut self, storage: &mut KvStorage, slot: HostSlot, block: BlockId) {
        let bytes = self.slots[slot as usize].take().expect("loading an empty host slot");
        let per_layer = storage.layout().layer_block_bytes();
        for (layer, chunk) in bytes.chunks_exact(per_layer).enumerate() {
            storage.set_block_bytes(layer, block, chunk).expect("a host slot has the pool's layout");
        }
        self.moved.1 += bytes.len() as u64;
    }

    fn bytes_moved(&self) -> (u64, u64) {
        self.moved
    }
}

/// Maximal runs of (block, slot) pairs, in order, whose blocks and slots
/// both step by one: `(first block, first slot, length)`. A run is one
/// copy per layer (or one strided copy) instead of one per block.
pub fn block_runs(pairs: &[(BlockId, HostSlot)]) -> Vec<(BlockId, HostSlot, usize)> {
    let mut out: Vec<(BlockId, HostSlot, usize)> = Vec::new();
    for &(block, slot) in pairs {
        if let Some((b, s, n)) = out.last_mut() {
            if *b as usize + *n == block as usize && *s as usize + *n == slot as usize {
                *n += 1;
                continue;
            }
        }
        out.push((block, slot, 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_coalesce_only_where_blocks_and_slots_both_step_by_one() {
        let pairs = [(4, 0), (5, 1), (6, 2), (9, 3), (10, 4), (11, 6), (3, 7)];
        assert_eq!(block_runs(&pairs), vec![(4, 0, 3), (9, 3, 2), (11, 6, 1), (3, 7, 1)]);
        assert!(block_runs(&[]).is_empty());
    }
}
