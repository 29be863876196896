//! What the scheduler asks of the KV memory around it, as one interface
//! (vLLM v1's KVCacheManager has the same shape: computed blocks at
//! admission, an allocation that may fail, a free): the block pool and the
//! caches that share it are one owner. The engine's implementation is its
//! cache hooks over the session cache; [`BlockAllocator`] alone is the one
//! without caches.

use kvc_kv_pool::{BlockAllocator, BlockId};

use crate::sequence::{SeqId, Sequence};

pub trait KvManager {
    /// Blocks in the pool.
    fn num_blocks(&self) -> usize;
    /// Blocks free now.
    fn num_free(&self) -> usize;
    /// Blocks (one reference each, now owned by the sequence) already
    /// holding the KV of the first `tokens` tokens of a sequence about to
    /// be admitted (a session's or the prefix index's hit); None when
    /// nothing is reusable.
    fn computed_blocks(&mut self, seq: &Sequence) -> Option<(Vec<BlockId>, usize)>;
    /// `n` new blocks for sequence `seq`, reclaiming cached KV first when
    /// fewer are free; None when they cannot be had.
    fn allocate(&mut self, seq: SeqId, n: usize) -> Option<Vec<BlockId>>;
    /// Drops one reference to each of `blocks`.
    fn free(&mut self, blocks: &[BlockId]);
    /// Whether the KV that [`Self::computed_blocks`] handed sequence `id`
    /// may be read: false while it is still being copied in (a host-tier
    /// restore running beside other sequences' work). Such a sequence keeps
    /// its place and computes nothing until it is.
    fn ready(&mut self, _id: SeqId) -> bool {
        true
    }
    /// Frees cached KV that no running sequence uses until `n` blocks are
    /// free, if it can.
    fn reclaim(&mut self, _n: usize) {}
    /// The scheduler gave back the blocks [`Self::computed_blocks`] (or
    /// seeding) handed sequence `seq` (a waiting sequence making room, a
    /// preemption, an admission that did not fit): whatever the lookup
    /// marked for it (a session's turn in flight) is released, so that the
    /// caches may evict that KV and its next admission looks up afresh.
    fn release(&mut self, _seq: &Sequence) {}
    /// Leading blocks of `seq`'s tokens that [`Self::computed_blocks`]
    /// would hand over already on the device (no copy), found without side
    /// effects.
    fn resident_blocks(&mut self, _seq: &Sequence) -> usize {
        0
    }
    /// Device blocks [`Self::reclaim`] could free now (an upper bound).
    fn reclaimable(&mut self) -> usize {
        0
    }
}

/// The pool alone: no caches, nothing to reuse or reclaim.
impl KvManager for BlockAllocator {
    fn num_blocks(&self) -> usize {
        BlockAllocator::num_blocks(self)
    }

    fn num_free(&self) -> usize {
        BlockAllocator::num_free(self)
    }

    fn computed_blocks(&mut self, _seq: &Sequence) -> Option<(Vec<BlockId>, usize)> {
        None
    }

    fn allocate(&mut self, _seq: SeqId, n: usize) -> Option<Vec<BlockId>> {
        BlockAllocator::allocate(self, n)
    }

    fn free(&mut self, blocks: &[BlockId]) {
        self.free_all(blocks);
    }
}
