//! Free list with reference counts: O(1) allocate and free.

use std::collections::VecDeque;

use crate::BlockId;

pub struct BlockAllocator {
    free: VecDeque<BlockId>,
    refcount: Vec<u32>,
}

impl BlockAllocator {
    pub fn new(num_blocks: usize) -> Self {
        Self { free: (0..num_blocks as BlockId).collect(), refcount: vec![0; num_blocks] }
    }

    pub fn num_blocks(&self) -> usize {
        self.refcount.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// `n` blocks with reference count 1, or `None` (and nothing taken) when
    /// fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len() {
            return None;
        }
        let blocks: Vec<BlockId> = self.free.drain(..n).collect();
        for &b in &blocks {
            debug_assert_eq!(self.refcount[b as usize], 0);
            self.refcount[b as usize] = 1;
        }
        Some(blocks)
    }

    /// Another holder of an allocated block.
    pub fn incref(&mut self, block: BlockId) {
        let rc = &mut self.refcount[block as usize];
        assert!(*rc > 0, "incref of free block {block}");
        *rc += 1;
    }

    /// Drops one reference; the block returns to the free list at zero.
    pub fn free(&mut self, block: BlockId) {
        let rc = &mut self.refcount[block as usize];
        assert!(*rc > 0, "double free of block {block}");
        *rc -= 1;
        if *rc == 0 {
            self.free.push_back(block);
        }
    }

    /// Frees every block of a table.
    pub fn free_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.free(b);
        }
    }

    pub fn refcount(&self, block: BlockId) -> u32 {
        self.refcount[block as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_is_all_or_nothing() {
        let mut a = BlockAllocator::new(4);
        assert!(a.allocate(5).is_none());
        assert_eq!(a.num_free(), 4);
        let b = a.allocate(3).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(a.num_free(), 1);
    }

    #[test]
    fn shared_block_is_freed_at_last_reference() {
        let mut a = BlockAllocator::new(2);
        let b = a.allocate(1).unwrap()[0];
        a.incref(b);
        a.free(b);
        assert_eq!(a.num_free(), 1);
        a.free(b);
        assert_eq!(a.num_free(), 2);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut a = BlockAllocator::new(1);
        let b = a.allocate(1).unwrap()[0];
        a.free(b);
        a.free(b);
    }
}
