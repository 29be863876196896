//! Paged KV memory: a block allocator with reference counts, block tables,
//! and the per-layer K/V storage those blocks index.
//!
//! Layout of the storage (one contiguous allocation, so a transport can
//! register it as one region): `[layer][block][k|v][slot][kv_head][head_dim]`.
//! A block of one layer (its K and V) is one contiguous byte range, and
//! consecutive block ids of a layer are adjacent, so block lists coalesce
//! into few large ranges.

mod allocator;
#[cfg(feature = "cuda")]
mod device_memory;
mod error;
mod host_arena;
mod layout;
#[cfg(feature = "cuda")]
mod pinned_arena;
mod storage;

pub use allocator::BlockAllocator;
pub use error::KvPoolError;
pub use host_arena::{block_runs, CopyTicket, HostArena, HostSlot, VecArena};
pub use layout::KvLayout;
#[cfg(feature = "cuda")]
pub use pinned_arena::PinnedArena;
pub use storage::{KvStorage, MemoryLocation, MemoryRegion};

/// Index of a block in the pool.
pub type BlockId = u32;

/// The blocks holding one sequence's KV, in token order: token `p` lives in
/// block `table[p / block_size]` at slot `p % block_size`.
pub type BlockTable = Vec<BlockId>;

/// Allocator plus storage: what the engine owns.
pub struct KvPool {
    pub allocator: BlockAllocator,
    pub storage: KvStorage,
}

impl KvPool {
    pub fn new(layout: KvLayout, num_blocks: usize) -> Result<Self, KvPoolError> {
        Ok(Self { allocator: BlockAllocator::new(num_blocks), storage: KvStorage::new(layout, num_blocks)? })
    }

    /// A pool whose storage lives on `device` (host memory for a CPU).
    pub fn new_on(layout: KvLayout, num_blocks: usize, device: &candle_core::Device) -> Result<Self, KvPoolError> {
        Ok(Self { allocator: BlockAllocator::new(num_blocks), storage: KvStorage::new_on(layout, num_blocks, device)? })
    }

    /// A pool over existing storage (all blocks free).
    pub fn with_storage(storage: KvStorage) -> Self {
        Self { allocator: BlockAllocator::new(storage.num_blocks()), storage }
    }

    /// As many blocks as fit in `bytes` (at least one).
    pub fn blocks_for_budget(layout: &KvLayout, bytes: usize) -> usize {
        (bytes / layout.bytes_per_block().max(1)).max(1)
    }

    pub fn layout(&self) -> &KvLayout {
        self.storage.layout()
    }

    pub fn block_size(&self) -> usize {
        self.storage.layout().block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.allocator.num_blocks()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size())
    }
}
