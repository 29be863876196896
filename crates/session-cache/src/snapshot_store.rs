//! A prefill worker's store of session KV (docs/disaggregation.md): snapshots pushed
//! by decode workers after their turns, and the KV of the worker's own
//! remote prefills. A later remote prefill of the session reuses the
//! longest verified prefix instead of recomputing it ("prefill bypass").
//!
//! Separate from the prefix index and from the scheduler's working set: the
//! store holds its own block references, is bounded in device blocks (not
//! sessions), and makes room least recently used entry first; the
//! scheduler's reclaim never touches it. Entries keep their token ids, so a
//! prefix is reused only where the tokens match exactly, in whole blocks.
//!
//! Two tiers: device blocks first, then the engine's host tier (the same
//! [`HostTier`] the session cache uses, shared: see `host_tier.rs`). When
//! the store must free device blocks (its capacity, or the pool's
//! pressure), the least recently used entry's blocks are demoted to host
//! slots while they last; when the host tier is full, the coldest
//! host-resident entry is dropped ([`spill::decide_spill`]). A bypass of a
//! demoted entry copies the blocks it needs back into fresh pool blocks
//! first. The published map lists entries of both tiers: both are servable.
//!
//! A push is two-phase: [`SnapshotStore::reserve`] says from which block
//! the store needs the session's blocks and sets blocks aside for them;
//! the peer writes them; [`SnapshotStore::commit`] makes them part of the
//! entry, [`SnapshotStore::abort`] (or expiry) gives them back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use kvc_kv_pool::{BlockAllocator, BlockId, KvStorage};

use crate::host_tier::HostTier;
use crate::session::{common_prefix, BlockLoc, Tier};

mod spill;
#[cfg(test)]
mod tests;

pub use spill::{decide_spill, SpillAction, SpillDecision, SpillInputs, SpillReason};

#[derive(Debug)]
struct Entry {
    tokens: Vec<u32>,
    blocks: Vec<BlockLoc>,
    last_use: u64,
    updated: Instant,
}

impl Entry {
    fn host_blocks(&self) -> usize {
        self.blocks.iter().filter(|l| matches!(l, BlockLoc::Host(_))).count()
    }

    fn device_blocks(&self) -> usize {
        self.blocks.len() - self.host_blocks()
    }
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
    /// Blocks in all, and those of them in the host tier.
    pub blocks: usize,
    pub host_blocks: usize,
    pub updated: Instant,
}

impl SnapshotInfo {
    /// Where the entry's blocks are.
    pub fn tier(&self) -> Tier {
        match (self.blocks - self.host_blocks, self.host_blocks) {
            (0, 0) => Tier::None,
            (_, 0) => Tier::Device,
            (0, _) => Tier::Host,
            _ => Tier::Mixed,
        }
    }
}

/// Counters (exported as Prometheus metrics by the server).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Pushes committed.
    pub ingested: u64,
    /// Blocks received by committed pushes.
    pub ingested_blocks: u64,
    /// Entries dropped (from either tier) to make room, and their blocks.
    pub evicted: u64,
    pub evicted_blocks: u64,
    /// Entries whose device blocks moved to the host tier, and those blocks.
    pub demoted: u64,
    pub demoted_blocks: u64,
    /// Blocks copied back from the host tier for a bypass.
    pub restored_blocks: u64,
    /// Decisions to make room, by (action, reason) ([`decide_spill`]).
    pub spills: BTreeMap<(String, String), u64>,
    /// Reservations given back (aborted or expired).
    pub aborted: u64,
    /// Reservations refused for lack of room.
    pub refused: u64,
    /// Remote prefills that reused a snapshot, and the tokens reused.
    pub bypass_hits: u64,
    pub bypass_tokens: u64,
    /// Of the hits, those that copied blocks back from the host tier (the
    /// rest were served from device blocks only).
    pub bypass_hits_host: u64,
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

/// What a prefill bypass asks of a snapshot: KV for a prompt of `session`
/// that covers at least `min_tokens` (what the caller holds already).
#[derive(Debug, Clone, Copy)]
pub struct BypassAsk<'a> {
    pub session: &'a str,
    pub prompt: &'a [u32],
    pub min_tokens: usize,
}

pub struct SnapshotStore {
    block_size: usize,
    capacity: usize,
    /// Device blocks referenced by entries and pending reservations.
    used: usize,
    /// Host slots held by entries (this store's share of the host tier).
    host_used: usize,
    host: HostTier,
    entries: HashMap<String, Entry>,
    /// Entries added, replaced, moved between tiers or removed since [`Self::take_changed`].
    changed: HashSet<String>,
    pending: HashMap<u64, Pending>,
    tick: u64,
    next_id: u64,
    pub stats: SnapshotStats,
}

impl SnapshotStore {
    /// A store of at most `capacity_blocks` device blocks (0 disables it),
    /// without a host tier until [`Self::set_host_tier`].
    pub fn new(block_size: usize, capacity_blocks: usize) -> Self {
        Self {
            block_size,
            capacity: capacity_blocks,
            used: 0,
            host_used: 0,
            host: HostTier::new(0),
            entries: HashMap::new(),
            changed: HashSet::new(),
            pending: HashMap::new(),
            tick: 0,
            next_id: 1,
            stats: SnapshotStats::default(),
        }
    }

    /// Spills into `tier` (the engine's one host tier, shared with the
    /// session cache: [`crate::SessionAwareCache::host_tier`]). Set before
    /// first use.
    pub fn set_host_tier(&mut self, tier: HostTier) {
        assert_eq!(self.host_used, 0, "the host tier is set before any entry spills");
        self.host = tier;
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Device blocks held (entries and reservations).
    pub fn used_blocks(&self) -> usize {
        self.used
    }

    /// Host-tier slots held by demoted entries.
    pub fn host_blocks(&self) -> usize {
        self.host_used
    }

    pub fn info(&self) -> HashMap<String, SnapshotInfo> {
        self.entries.keys().filter_map(|id| Some((id.clone(), self.info_of(id)?))).collect()
    }

    fn info_of(&self, session: &str) -> Option<SnapshotInfo> {
        self.entries.get(session).map(|e| SnapshotInfo {
            tokens: e.tokens.len(),
            blocks: e.blocks.len(),
            host_blocks: e.host_blocks(),
            updated: e.updated,
        })
    }

    /// The entries changed since the last call, with their current view
    /// (None: removed): a published map kept from these costs O(changes)
    /// per step, not O(entries).
    pub fn take_changed(&mut self) -> Vec<(String, Option<SnapshotInfo>)> {
        crate::changes::views_of(std::mem::take(&mut self.changed), |id| self.info_of(id))
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Blocks (one new reference each, now the caller's) holding the KV of
    /// the longest whole-block prefix of `prompt` that the session's
    /// snapshot covers, leaving at least the prompt's last token to
    /// compute; None when that is nothing or fewer than `min_tokens` (what
    /// the caller holds already). Blocks in the host tier are copied back
    /// into fresh pool blocks first (the copies are flushed before this
    /// returns: the next step may read them); if the pool or the store
    /// cannot take them all, the restored part of the prefix is served.
    pub fn lookup(&mut self, ask: BypassAsk, alloc: &mut BlockAllocator, storage: &mut KvStorage) -> Option<(Vec<BlockId>, usize)> {
        let BypassAsk { session, prompt, min_tokens } = ask;
        let tick = self.touch();
        let bs = self.block_size;
        let covered = self.covered(session, prompt) / bs;
        if covered == 0 || covered * bs < min_tokens {
            self.stats.bypass_misses += 1;
            return None;
        }
        self.entries.get_mut(session).expect("covered entry").last_use = tick;
        let (n, restored) = self.restore_prefix(session, covered, alloc, storage);
        if n == 0 || n * bs < min_tokens {
            self.stats.bypass_misses += 1;
            return None;
        }
        let blocks: Vec<BlockId> = self.entries[session].blocks[..n]
            .iter()
            .map(|l| match *l {
                BlockLoc::Device(b) => b,
                BlockLoc::Host(_) => unreachable!("the prefix was restored"),
            })
            .collect();
        for &b in &blocks {
            alloc.incref(b);
        }
        self.stats.bypass_hits += 1;
        self.stats.bypass_tokens += (n * bs) as u64;
        if restored > 0 {
            self.stats.bypass_hits_host += 1;
        }
        Some((blocks, n * bs))
    }

    /// Tokens of `prompt` that [`Self::lookup`] would serve for `session`
    /// (whole blocks, in either tier, leaving the prompt's last token to
    /// compute) if any restore from the host tier succeeds; 0 if none. No
    /// side effects: what a caller deciding between sources asks first.
    pub fn covered(&self, session: &str, prompt: &[u32]) -> usize {
        let max_reuse = prompt.len().saturating_sub(1);
        let blocks =
            self.entries.get(session).map_or(0, |e| (common_prefix(&e.tokens, &prompt[..max_reuse]) / self.block_size).min(e.blocks.len()));
        blocks * self.block_size
    }

    /// A remote prefill of `session` that a caller served without its
    /// snapshot (it covered too little), counted as a miss as
    /// [`Self::lookup`] counts its own.
    pub fn missed(&mut self) {
        self.stats.bypass_misses += 1;
    }

    /// Tokens of the session's snapshot (0 if none), in either tier.
    pub fn tokens_of(&self, session: &str) -> usize {
        self.entries.get(session).map_or(0, |e| e.tokens.len())
    }

    /// Sets blocks aside for a push of `tokens` (whole blocks) for
    /// `session`. Blocks of the current entry whose tokens match are kept
    /// (in whichever tier they are); the reservation covers the rest. Other
    /// sessions' entries make room, least recently used first. The blocks
    /// returned may be written by a peer at once: copies out of them are
    /// waited for.
    pub fn reserve(
        &mut self,
        session: &str,
        tokens: Vec<u32>,
        alloc: &mut BlockAllocator,
        storage: &KvStorage,
    ) -> Result<SnapshotReservation, SnapshotError> {
        let bs = self.block_size;
        if tokens.len() % bs != 0 {
            return Err(SnapshotError::NotWholeBlocks { tokens: tokens.len(), block_size: bs });
        }
        let keep = self.entries.get(session).map_or(0, |e| (common_prefix(&e.tokens, &tokens) / bs).min(e.blocks.len()));
        let need = tokens.len() / bs - keep;
        // The entry's device blocks past `keep` are replaced at commit: count them as room.
        let replaced =
            self.entries.get(session).map_or(0, |e| e.blocks[keep..].iter().filter(|l| matches!(l, BlockLoc::Device(_))).count());
        while self.used - replaced.min(self.used) + need > self.capacity || alloc.num_free() < need {
            if !self.spill_lru(Some(session), alloc, storage) {
                self.stats.refused += 1;
                self.host.flush();
                return Err(SnapshotError::NoRoom { need, capacity: self.capacity, free: alloc.num_free() });
            }
        }
        let blocks = alloc.allocate(need).expect("free blocks were counted");
        // A peer writes these blocks over the transport, outside the
        // arena's stream ordering: a demotion's copies out of them end first.
        self.host.wait_for(&blocks);
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
        let keep_tokens = p.keep * bs;
        let kept: Vec<BlockLoc> = match self.entries.remove(&p.session) {
            Some(mut e)
                if e.blocks.len() >= p.keep && e.tokens.len() >= keep_tokens && e.tokens[..keep_tokens] == p.tokens[..keep_tokens] =>
            {
                // The kept prefix moves into the new entry as it is (device or host).
                let tail = e.blocks.split_off(p.keep);
                self.release(alloc, &tail);
                e.blocks
            }
            None if p.keep == 0 => Vec::new(),
            other => {
                // The prefix this push builds on is gone (evicted or replaced).
                if let Some(e) = other {
                    self.entries.insert(p.session.clone(), e);
                }
                self.release_device(alloc, &p.blocks);
                self.stats.aborted += 1;
                return Err(SnapshotError::UnknownReservation(id));
            }
        };
        self.stats.ingested += 1;
        self.stats.ingested_blocks += p.blocks.len() as u64;
        let mut blocks = kept;
        blocks.extend(p.blocks.iter().map(|&b| BlockLoc::Device(b)));
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
        self.release_device(alloc, &p.blocks);
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
    pub fn ingest_local(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], alloc: &mut BlockAllocator, storage: &KvStorage) {
        let n = (tokens.len() / self.block_size).min(blocks.len());
        if n == 0 || self.capacity == 0 || self.tokens_of(session) >= n * self.block_size {
            return;
        }
        let replaced = self.entries.get(session).map_or(0, Entry::device_blocks);
        while self.used - replaced + n > self.capacity {
            if !self.spill_lru(Some(session), alloc, storage) {
                self.host.flush();
                return;
            }
        }
        self.host.flush();
        for &b in &blocks[..n] {
            alloc.incref(b);
        }
        self.used += n;
        if let Some(old) = self.entries.remove(session) {
            self.release(alloc, &old.blocks);
        }
        let tick = self.touch();
        let entry = Entry {
            tokens: tokens[..n * self.block_size].to_vec(),
            blocks: blocks[..n].iter().map(|&b| BlockLoc::Device(b)).collect(),
            last_use: tick,
            updated: Instant::now(),
        };
        self.changed.insert(session.to_string());
        self.entries.insert(session.to_string(), entry);
    }

    /// Drops the session's entry (both tiers); true if it had one.
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

    /// Frees device blocks, least recently used entry first (demoted to the
    /// host tier while it has room, else dropped), until `need` blocks are
    /// free or no entry holds device blocks: snapshots yield to the requests
    /// a prefill worker must compute. Returns the blocks freed.
    pub fn reclaim(&mut self, need: usize, alloc: &mut BlockAllocator, storage: &KvStorage) -> usize {
        let start = alloc.num_free();
        while alloc.num_free() < need && self.spill_lru(None, alloc, storage) {}
        // Blocks demoted above are free now: their copies come first.
        self.host.flush();
        alloc.num_free() - start
    }

    /// Releases blocks of either tier that the store held.
    fn release(&mut self, alloc: &mut BlockAllocator, blocks: &[BlockLoc]) {
        for &loc in blocks {
            match loc {
                BlockLoc::Device(b) => {
                    alloc.free(b);
                    self.used -= 1;
                }
                BlockLoc::Host(h) => {
                    self.host.release(h);
                    self.host_used -= 1;
                }
            }
        }
    }

    fn release_device(&mut self, alloc: &mut BlockAllocator, blocks: &[BlockId]) {
        for &b in blocks {
            alloc.free(b);
        }
        self.used -= blocks.len();
    }
}
