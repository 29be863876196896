//! A prefill worker's store of session KV (docs/disaggregation.md): snapshots pushed
//! by decode workers after their turns, and the KV of the worker's own
//! remote prefills. A later remote prefill of the session reuses the
//! longest verified prefix instead of recomputing it ("prefill bypass").
//!
//! Separate from the prefix index and from the scheduler's working set: the
//! store holds its own block references, is bounded in blocks (not
//! sessions), and evicts whole entries least recently used first; the
//! scheduler's reclaim never touches it. Entries keep their token ids, so a
//! prefix is reused only where the tokens match exactly, in whole blocks.
//!
//! A push is two-phase: [`SnapshotStore::reserve`] says from which block
//! the store needs the session's blocks and sets blocks aside for them;
//! the peer writes them; [`SnapshotStore::commit`] makes them part of the
//! entry, [`SnapshotStore::abort`] (or expiry) gives them back.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kvc_kv_pool::{BlockAllocator, BlockId};

use crate::session::common_prefix;

#[derive(Debug)]
struct Entry {
    tokens: Vec<u32>,
    blocks: Vec<BlockId>,
    last_use: u64,
    updated: Instant,
}

#[derive(Debug)]
struct Pending {
    session: String,
    tokens: Vec<u32>,
    /// Blocks of the current entry kept (the verified prefix).
    keep: usize,
    blocks: Vec<BlockId>,
    created: Instant,
}

/// Published view of one entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotInfo {
    pub tokens: usize,
    pub blocks: usize,
    pub updated: Instant,
}

/// Counters (exported as Prometheus metrics by the server).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Pushes committed.
    pub ingested: u64,
    /// Blocks received by committed pushes.
    pub ingested_blocks: u64,
    /// Entries evicted to make room.
    pub evicted: u64,
    pub evicted_blocks: u64,
    /// Reservations given back (aborted or expired).
    pub aborted: u64,
    /// Reservations refused for lack of room.
    pub refused: u64,
    /// Remote prefills that reused a snapshot, and the tokens reused.
    pub bypass_hits: u64,
    pub bypass_tokens: u64,
    /// Remote prefills of a session without a usable snapshot.
    pub bypass_misses: u64,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("the snapshot store cannot hold {need} more blocks (capacity {capacity}, {free} free in the pool)")]
    NoRoom { need: usize, capacity: usize, free: usize },
    #[error("snapshot tokens must be a whole number of blocks of {block_size} ({tokens} given)")]
    NotWholeBlocks { tokens: usize, block_size: usize },
    #[error("unknown snapshot reservation {0}")]
    UnknownReservation(u64),
}

/// A reservation: the peer writes blocks `from_block..` into `blocks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotReservation {
    pub id: u64,
    pub from_block: usize,
    pub blocks: Vec<BlockId>,
}

#[derive(Debug)]
pub struct SnapshotStore {
    block_size: usize,
    capacity: usize,
    /// Blocks referenced by entries and pending reservations.
    used: usize,
    entries: HashMap<String, Entry>,
    /// Entries added, replaced or removed since [`Self::take_changed`].
    changed: HashSet<String>,
    pending: HashMap<u64, Pending>,
    tick: u64,
    next_id: u64,
    pub stats: SnapshotStats,
}

impl SnapshotStore {
    /// A store of at most `capacity_blocks` blocks (0 disables it).
    pub fn new(block_size: usize, capacity_blocks: usize) -> Self {
        Self {
            block_size,
            capacity: capacity_blocks,
            used: 0,
            entries: HashMap::new(),
            changed: HashSet::new(),
            pending: HashMap::new(),
            tick: 0,
            next_id: 1,
            stats: SnapshotStats::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn used_blocks(&self) -> usize {
        self.used
    }

    pub fn info(&self) -> HashMap<String, SnapshotInfo> {
        self.entries.keys().filter_map(|id| Some((id.clone(), self.info_of(id)?))).collect()
    }

    fn info_of(&self, session: &str) -> Option<SnapshotInfo> {
        self.entries.get(session).map(|e| SnapshotInfo { tokens: e.tokens.len(), blocks: e.blocks.len(), updated: e.updated })
    }

    /// The entries changed since the last call, with their current view
    /// (None: removed): a published map kept from these costs O(changes)
    /// per step, not O(entries).
    pub fn take_changed(&mut self) -> Vec<(String, Option<SnapshotInfo>)> {
        let changed = std::mem::take(&mut self.changed);
        changed
            .into_iter()
            .map(|id| {
                let info = self.info_of(&id);
                (id, info)
            })
            .collect()
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Blocks (one new reference each, now the caller's) holding the KV of
    /// the longest whole-block prefix of `prompt` that the session's
    /// snapshot covers, leaving at least the prompt's last token to
    /// compute; None when nothing is reusable.
    pub fn lookup(&mut self, session: &str, prompt: &[u32], alloc: &mut BlockAllocator) -> Option<(Vec<BlockId>, usize)> {
        let tick = self.touch();
        let bs = self.block_size;
        let Some(e) = self.entries.get_mut(session) else {
            self.stats.bypass_misses += 1;
            return None;
        };
        let max_reuse = prompt.len().saturating_sub(1);
        let k = common_prefix(&e.tokens, &prompt[..max_reuse]);
        let n = (k / bs).min(e.blocks.len());
        if n == 0 {
            self.stats.bypass_misses += 1;
            return None;
        }
        e.last_use = tick;
        let blocks = e.blocks[..n].to_vec();
        for &b in &blocks {
            alloc.incref(b);
        }
        self.stats.bypass_hits += 1;
        self.stats.bypass_tokens += (n * bs) as u64;
        Some((blocks, n * bs))
    }

    /// Tokens of the session's snapshot (0 if none).
    pub fn tokens_of(&self, session: &str) -> usize {
        self.entries.get(session).map_or(0, |e| e.tokens.len())
    }

    /// Sets blocks aside for a push of `tokens` (whole blocks) for
    /// `session`. Blocks of the current entry whose tokens match are kept;
    /// the reservation covers the rest. Evicts other sessions' entries,
    /// least recently used first, to make room.
    pub fn reserve(&mut self, session: &str, tokens: Vec<u32>, alloc: &mut BlockAllocator) -> Result<SnapshotReservation, SnapshotError> {
        let bs = self.block_size;
        if tokens.len() % bs != 0 {
            return Err(SnapshotError::NotWholeBlocks { tokens: tokens.len(), block_size: bs });
        }
        let keep = self.entries.get(session).map_or(0, |e| (common_prefix(&e.tokens, &tokens) / bs).min(e.blocks.len()));
        let need = tokens.len() / bs - keep;
        // The entry's blocks past `keep` are replaced at commit: count them as room.
        let replaced = self.entries.get(session).map_or(0, |e| e.blocks.len() - keep);
        while self.used - replaced.min(self.used) + need > self.capacity || alloc.num_free() < need {
            if !self.evict_lru(Some(session), alloc) {
                self.stats.refused += 1;
                return Err(SnapshotError::NoRoom { need, capacity: self.capacity, free: alloc.num_free() });
            }
        }
        let blocks = alloc.allocate(need).expect("free blocks were counted");
        self.used += need;
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, Pending { session: session.to_string(), tokens, keep, blocks: blocks.clone(), created: Instant::now() });
        Ok(SnapshotReservation { id, from_block: keep, blocks })
    }

    /// Makes a written reservation the session's entry; returns the tokens
    /// it covers. If the entry changed meanwhile so that the kept prefix no
    /// longer matches, the push is dropped (aborted) instead.
    pub fn commit(&mut self, id: u64, alloc: &mut BlockAllocator) -> Result<usize, SnapshotError> {
        let p = self.pending.remove(&id).ok_or(SnapshotError::UnknownReservation(id))?;
        let bs = self.block_size;
        let tick = self.touch();
        let kept: Vec<BlockId> = match self.entries.get(&p.session) {
            Some(e) if e.blocks.len() >= p.keep && e.tokens.len() >= p.keep * bs && e.tokens[..p.keep * bs] == p.tokens[..p.keep * bs] => {
                e.blocks[..p.keep].to_vec()
            }
            None if p.keep == 0 => Vec::new(),
            _ => {
                // The prefix this push builds on is gone (evicted or replaced).
                self.release(alloc, &p.blocks);
                self.stats.aborted += 1;
                return Err(SnapshotError::UnknownReservation(id));
            }
        };
        for &b in &kept {
            alloc.incref(b);
        }
        self.used += kept.len();
        if let Some(old) = self.entries.remove(&p.session) {
            self.release(alloc, &old.blocks);
        }
        self.stats.ingested += 1;
        self.stats.ingested_blocks += p.blocks.len() as u64;
        let mut blocks = kept;
        blocks.extend(p.blocks);
        let n = p.tokens.len();
        self.changed.insert(p.session.clone());
        self.entries.insert(p.session, Entry { tokens: p.tokens, blocks, last_use: tick, updated: Instant::now() });
        Ok(n)
    }

    /// Gives a reservation's blocks back (the push failed or was abandoned).
    pub fn abort(&mut self, id: u64, alloc: &mut BlockAllocator) -> bool {
        let Some(p) = self.pending.remove(&id) else {
            return false;
        };
        self.release(alloc, &p.blocks);
        self.stats.aborted += 1;
        true
    }

    /// Aborts reservations older than `max_age` (their pusher went away).
    pub fn expire_pending(&mut self, max_age: Duration, alloc: &mut BlockAllocator) -> usize {
        let old: Vec<u64> = self.pending.iter().filter(|(_, p)| p.created.elapsed() > max_age).map(|(&id, _)| id).collect();
        for id in &old {
            self.abort(*id, alloc);
        }
        old.len()
    }

    /// Records KV this worker computed itself for `session` (a remote
    /// prefill's prompt, whole blocks): it becomes the entry when it covers
    /// more than the current one. Takes new references on the blocks.
    pub fn ingest_local(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], alloc: &mut BlockAllocator) {
        let n = (tokens.len() / self.block_size).min(blocks.len());
        if n == 0 || self.capacity == 0 || self.tokens_of(session) >= n * self.block_size {
            return;
        }
        let replaced = self.entries.get(session).map_or(0, |e| e.blocks.len());
        while self.used - replaced + n > self.capacity {
            if !self.evict_lru(Some(session), alloc) {
                return;
            }
        }
        for &b in &blocks[..n] {
            alloc.incref(b);
        }
        self.used += n;
        if let Some(old) = self.entries.remove(session) {
            self.release(alloc, &old.blocks);
        }
        let tick = self.touch();
        let entry =
            Entry { tokens: tokens[..n * self.block_size].to_vec(), blocks: blocks[..n].to_vec(), last_use: tick, updated: Instant::now() };
        self.changed.insert(session.to_string());
        self.entries.insert(session.to_string(), entry);
    }

    /// Drops the session's entry; true if it had one.
    pub fn remove(&mut self, session: &str, alloc: &mut BlockAllocator) -> bool {
        match self.entries.remove(session) {
            Some(e) => {
                self.changed.insert(session.to_string());
                self.release(alloc, &e.blocks);
                true
            }
            None => false,
        }
    }

    /// Evicts entries, least recently used first, until `need` blocks are
    /// free or none is left: snapshots are a cache that yields to the
    /// requests a prefill worker must compute (they can be pushed again).
    /// Returns the blocks freed.
    pub fn reclaim(&mut self, need: usize, alloc: &mut BlockAllocator) -> usize {
        let start = alloc.num_free();
        while alloc.num_free() < need && self.evict_lru(None, alloc) {}
        alloc.num_free() - start
    }

    /// Evicts the least recently used entry other than `keep`'s.
    fn evict_lru(&mut self, keep: Option<&str>, alloc: &mut BlockAllocator) -> bool {
        let victim =
            self.entries.iter().filter(|(id, _)| Some(id.as_str()) != keep).min_by_key(|(_, e)| e.last_use).map(|(id, _)| id.clone());
        let Some(id) = victim else { return false };
        let e = self.entries.remove(&id).expect("victim exists");
        self.changed.insert(id.clone());
        self.stats.evicted += 1;
        self.stats.evicted_blocks += e.blocks.len() as u64;
        tracing::info!(event = "snapshot_evicted", session = %id, blocks = e.blocks.len(), reason = "lru");
        self.release(alloc, &e.blocks);
        true
    }

    fn release(&mut self, alloc: &mut BlockAllocator, blocks: &[BlockId]) {
        for &b in blocks {
            alloc.free(b);
        }
        self.used -= blocks.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    fn push(store: &mut SnapshotStore, s: &str, tokens: Vec<u32>, alloc: &mut BlockAllocator) -> SnapshotReservation {
        let r = store.reserve(s, tokens, alloc).unwrap();
        store.commit(r.id, alloc).unwrap();
        r
    }

    #[test]
    fn a_delta_push_sends_only_new_blocks_and_lookup_verifies_tokens() {
        let mut alloc = BlockAllocator::new(64);
        let mut store = SnapshotStore::new(4, 32);
        let t = toks(24, 1);
        let r1 = push(&mut store, "s", t[..8].to_vec(), &mut alloc);
        assert_eq!((r1.from_block, r1.blocks.len()), (0, 2));
        let r2 = store.reserve("s", t[..16].to_vec(), &mut alloc).unwrap();
        assert_eq!((r2.from_block, r2.blocks.len()), (2, 2), "only the two new blocks");
        assert_eq!(store.commit(r2.id, &mut alloc).unwrap(), 16);
        assert_eq!(store.used_blocks(), 4);
        // A prompt that diverges inside block 2 reuses blocks 0 and 1 only.
        let mut prompt = t.clone();
        prompt[9] = 999;
        let (blocks, n) = store.lookup("s", &prompt, &mut alloc).unwrap();
        assert_eq!((blocks.len(), n), (2, 8));
        alloc.free_all(&blocks);
        // Exact-match session ids only.
        assert!(store.lookup("s2", &t, &mut alloc).is_none());
        // The prompt's last token is always left to compute.
        let (b, n) = store.lookup("s", &t[..16], &mut alloc).unwrap();
        assert_eq!(n, 12);
        alloc.free_all(&b);
    }

    #[test]
    fn a_diverged_history_replaces_the_tail_and_frees_it() {
        let mut alloc = BlockAllocator::new(64);
        let mut store = SnapshotStore::new(4, 32);
        push(&mut store, "s", toks(16, 1), &mut alloc);
        let mut t2 = toks(16, 1);
        t2[5] = 1000;
        let r = store.reserve("s", t2.clone(), &mut alloc).unwrap();
        assert_eq!(r.from_block, 1);
        store.commit(r.id, &mut alloc).unwrap();
        assert_eq!(store.used_blocks(), 4);
        assert_eq!(alloc.num_free(), 60, "old tail blocks returned");
        assert!(store.remove("s", &mut alloc));
        assert_eq!(alloc.num_free(), 64);
    }

    #[test]
    fn bounded_in_blocks_with_lru_eviction() {
        let mut alloc = BlockAllocator::new(64);
        let mut store = SnapshotStore::new(4, 5);
        push(&mut store, "a", toks(8, 1), &mut alloc);
        push(&mut store, "b", toks(8, 2), &mut alloc);
        // Touch a: b becomes the least recently used.
        let (bl, _) = store.lookup("a", &toks(9, 1), &mut alloc).unwrap();
        alloc.free_all(&bl);
        push(&mut store, "c", toks(8, 3), &mut alloc);
        let info = store.info();
        assert!(info.contains_key("a") && info.contains_key("c") && !info.contains_key("b"));
        assert_eq!(store.stats.evicted, 1);
        assert!(store.used_blocks() <= 5);
        // Larger than the store: refused, nothing lost.
        assert!(matches!(store.reserve("d", toks(28, 4), &mut alloc), Err(SnapshotError::NoRoom { .. })));
        assert_eq!(store.info().len(), 0, "everything was evicted trying");
        assert_eq!(alloc.num_free(), 64);
    }

    #[test]
    fn abort_and_expiry_return_blocks_and_blocks_in_use_survive_eviction() {
        let mut alloc = BlockAllocator::new(16);
        let mut store = SnapshotStore::new(4, 8);
        let r = store.reserve("s", toks(8, 1), &mut alloc).unwrap();
        assert!(store.abort(r.id, &mut alloc));
        assert_eq!(alloc.num_free(), 16);
        store.reserve("s", toks(8, 1), &mut alloc).unwrap();
        assert_eq!(store.expire_pending(Duration::ZERO, &mut alloc), 1);
        assert_eq!((alloc.num_free(), store.used_blocks()), (16, 0));
        // A running bypass keeps its blocks when the entry is evicted.
        push(&mut store, "s", toks(8, 1), &mut alloc);
        let (held, _) = store.lookup("s", &toks(9, 1), &mut alloc).unwrap();
        assert!(store.remove("s", &mut alloc));
        assert!(held.iter().all(|&b| alloc.refcount(b) == 1));
        alloc.free_all(&held);
        assert_eq!(alloc.num_free(), 16);
    }

    #[test]
    fn local_ingest_keeps_the_longer_snapshot() {
        let mut alloc = BlockAllocator::new(16);
        let mut store = SnapshotStore::new(4, 8);
        let blocks = alloc.allocate(3).unwrap();
        store.ingest_local("s", &toks(10, 1), &blocks, &mut alloc);
        assert_eq!(store.tokens_of("s"), 8);
        alloc.free_all(&blocks);
        assert_eq!(alloc.num_free(), 14, "the store keeps two blocks");
        let r = store.reserve("s", toks(12, 1), &mut alloc).unwrap();
        assert_eq!((r.from_block, r.blocks.len()), (2, 1));
    }

    #[test]
    fn reclaim_evicts_least_recently_used_entries_until_enough_is_free() {
        let mut alloc = BlockAllocator::new(12);
        let mut store = SnapshotStore::new(4, 12);
        push(&mut store, "old", toks(16, 1), &mut alloc);
        push(&mut store, "new", toks(16, 2), &mut alloc);
        assert_eq!(alloc.num_free(), 4);
        assert_eq!(store.reclaim(6, &mut alloc), 4, "one entry (the older) is enough");
        assert_eq!(store.tokens_of("old"), 0);
        assert_eq!(store.tokens_of("new"), 16);
        assert_eq!(store.reclaim(100, &mut alloc), 4, "then everything, and no more");
        assert_eq!((alloc.num_free(), store.used_blocks()), (12, 0));
    }

    /// A map kept by applying [`SnapshotStore::take_changed`] after every
    /// operation equals [`SnapshotStore::info`]: pushes, replacements,
    /// local ingests, LRU eviction, removal.
    #[test]
    fn changed_entries_keep_a_mirror_equal_to_the_listing() {
        let mut alloc = BlockAllocator::new(64);
        let mut store = SnapshotStore::new(4, 12);
        let mut mirror: HashMap<String, SnapshotInfo> = HashMap::new();
        let mut check = |store: &mut SnapshotStore, what: &str| {
            for (id, info) in store.take_changed() {
                match info {
                    Some(i) => mirror.insert(id, i),
                    None => mirror.remove(&id),
                };
            }
            assert_eq!(mirror, store.info(), "after {what}");
        };
        for (i, s) in ["a", "b", "c", "a", "d"].iter().enumerate() {
            push(&mut store, s, toks(4 * (2 + i), i as u32), &mut alloc);
            check(&mut store, "a push");
        }
        let blocks = alloc.allocate(3).unwrap();
        store.ingest_local("e", &toks(4 * 3, 9), &blocks, &mut alloc);
        alloc.free_all(&blocks);
        check(&mut store, "a local ingest");
        store.reclaim(64, &mut alloc);
        check(&mut store, "reclaim");
        push(&mut store, "f", toks(4 * 2, 11), &mut alloc);
        store.remove("f", &mut alloc);
        check(&mut store, "remove");
        assert!(store.take_changed().is_empty());
    }
}
