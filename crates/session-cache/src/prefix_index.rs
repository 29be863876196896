//! Full blocks by chained hash, each holding one pool reference, with LRU
//! ticks for eviction.

use std::collections::HashMap;

use kvc_kv_pool::BlockId;

use crate::block_hash::BlockHash;

struct Entry {
    block: BlockId,
    tokens: Box<[u32]>,
    last_use: u64,
}

#[derive(Default)]
pub struct PrefixIndex {
    by_hash: HashMap<BlockHash, Entry>,
    by_block: HashMap<BlockId, BlockHash>,
}

impl PrefixIndex {
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// The block cached under `hash` if its tokens are `tokens`.
    pub fn lookup(&mut self, hash: BlockHash, tokens: &[u32], tick: u64) -> Option<BlockId> {
        let e = self.by_hash.get_mut(&hash)?;
        if &*e.tokens != tokens {
            return None; // a hash collision: never serve it
        }
        e.last_use = tick;
        Some(e.block)
    }

    /// [`Self::lookup`] without marking the block used.
    pub fn peek(&self, hash: BlockHash, tokens: &[u32]) -> Option<BlockId> {
        self.by_hash.get(&hash).filter(|e| &*e.tokens == tokens).map(|e| e.block)
    }

    pub fn contains_block(&self, block: BlockId) -> bool {
        self.by_block.contains_key(&block)
    }

    pub fn contains_hash(&self, hash: BlockHash) -> bool {
        self.by_hash.contains_key(&hash)
    }

    /// Adds a block (the caller takes the pool reference for the index).
    pub fn insert(&mut self, hash: BlockHash, tokens: &[u32], block: BlockId, tick: u64) {
        self.by_block.insert(block, hash);
        self.by_hash.insert(hash, Entry { block, tokens: tokens.into(), last_use: tick });
    }

    /// Moves a block to the front of the eviction order.
    pub fn demote(&mut self, block: BlockId) {
        if let Some(h) = self.by_block.get(&block) {
            if let Some(e) = self.by_hash.get_mut(h) {
                e.last_use = 0;
            }
        }
    }

    /// Removes a block; the caller drops the index's pool reference.
    pub fn remove_block(&mut self, block: BlockId) -> bool {
        match self.by_block.remove(&block) {
            Some(h) => {
                self.by_hash.remove(&h);
                true
            }
            None => false,
        }
    }

    /// Indexed blocks accepted by `evictable`, least recently used first.
    pub fn lru_blocks(&self, evictable: impl Fn(BlockId) -> bool) -> Vec<BlockId> {
        let mut v: Vec<(u64, BlockId)> = self.by_hash.values().filter(|e| evictable(e.block)).map(|e| (e.last_use, e.block)).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, b)| b).collect()
    }
}
