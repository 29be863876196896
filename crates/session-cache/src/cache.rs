//! SessionAwareCache: sessions' KV across turns, the prefix index, and
//! tiered eviction (unreferenced cached blocks -> host tier -> drop; the
//! eviction pass is in [`reclaim`]).
//!
//! Reference counting: every holder of a device block owns one allocator
//! reference: running requests (their block tables), the prefix index (one
//! per indexed block) and sessions (one per device block they hold).
//! `cache_refs[b]` counts the index's and sessions' references, so
//! `refcount(b) - cache_refs[b]` is the number of running requests using
//! `b`; a block with running users is never evicted.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kvc_kv_pool::{BlockAllocator, BlockId, CopyTicket, KvStorage};
use kvc_policy::session_cap::{decide_session_cap, SessionCapCandidate};

use crate::block_hash::{hash_block, BlockHash};
use crate::host_tier::HostTier;
use crate::prefix_index::PrefixIndex;
use crate::reuse_path::ReusePath;
use crate::session::{common_prefix, BlockLoc, Session, SessionInfo};
use crate::stats::CacheStats;

mod reclaim;
#[cfg(test)]
mod tests;
mod write_back;

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    /// Blocks of the host tier (0 disables it).
    pub host_blocks: usize,
    /// Idle sessions older than this are deleted.
    pub session_ttl: Duration,
    /// Most sessions one API key's namespace keeps ([`crate::session_key`];
    /// 0: no limit). A new session past it drops that key's least recently
    /// used idle session, so one client cannot push every other client's
    /// sessions out.
    pub max_sessions_per_key: usize,
}

/// What [`SessionAwareCache::acquire`] hands a new request: blocks (one
/// reference each, owned by the request) holding its first `tokens` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub blocks: Vec<BlockId>,
    pub tokens: usize,
    pub source: ReusePath,
    /// Blocks copied back from the host tier for this request.
    pub restored_blocks: usize,
    /// Where the host tier's copies run beside the compute work: the
    /// restores' batch, which must be done ([`SessionAwareCache::copies_done`])
    /// before the request's blocks are read. None: readable at once.
    pub ready_after: Option<CopyTicket>,
}

pub struct SessionAwareCache {
    config: CacheConfig,
    index: PrefixIndex,
    sessions: HashMap<String, Session>,
    /// Sessions changed since [`Self::take_changed_sessions`] last ran.
    changed: HashSet<String>,
    host: HostTier,
    /// Device blocks that write-back has also copied to a host slot (the
    /// copy stays valid while the cache holds the block: cached blocks are
    /// never written again).
    mirrors: HashMap<BlockId, crate::host_tier::HostBlockId>,
    /// The last write-back batch (the next waits for it).
    write_back_ticket: Option<CopyTicket>,
    /// The last batch of restores issued without ordering the compute
    /// stream after it (their sequences wait for it instead).
    restore_ticket: Option<CopyTicket>,
    /// A block was freed while restores may still write it: the next
    /// [`Self::order_copies`] orders the compute stream after them.
    order_needed: bool,
    cache_refs: Vec<u32>,
    tick: u64,
    pub stats: CacheStats,
}

impl SessionAwareCache {
    pub fn new(config: CacheConfig, num_blocks: usize) -> Self {
        Self {
            host: HostTier::new(config.host_blocks),
            config,
            index: PrefixIndex::default(),
            sessions: HashMap::new(),
            changed: HashSet::new(),
            mirrors: HashMap::new(),
            write_back_ticket: None,
            restore_ticket: None,
            order_needed: false,
            cache_refs: vec![0; num_blocks],
            tick: 1,
            stats: CacheStats::default(),
        }
    }

    /// The host tier's memory and copies (a GPU pool's pinned arena); by
    /// default plain vectors of `host_blocks` slots. Set before first use.
    pub fn set_host_arena(&mut self, arena: Box<dyn kvc_kv_pool::HostArena>) {
        self.config.host_blocks = arena.capacity();
        self.host = HostTier::with_arena(arena);
    }

    /// Whether the host tier's copies of `ticket` are done (a restoring
    /// request's blocks may be read).
    pub fn copies_done(&mut self, ticket: CopyTicket) -> bool {
        let done = self.host.done(ticket);
        if done && self.restore_ticket.is_some_and(|t| t <= ticket) {
            self.restore_ticket = None;
            self.order_needed = false;
        }
        done
    }

    /// Blocks until the host tier's copies of `ticket` are done (when
    /// nothing else can run).
    pub fn wait_copies(&mut self, ticket: CopyTicket) {
        self.host.wait(ticket);
        self.copies_done(ticket);
    }

    /// Before a forward pass: if a block was freed while restores issued
    /// beside compute may still write it, orders the compute stream after
    /// them (it could otherwise be handed out and written meanwhile).
    pub fn order_copies(&mut self) {
        if let Some(t) = self.restore_ticket {
            if self.copies_done(t) {
                return;
            }
        }
        if self.order_needed {
            self.host.flush();
            self.order_needed = false;
            // Everything queued on the compute stream from now on follows them.
            self.restore_ticket = None;
        }
    }

    /// A handle on the host tier, to share it (a prefill worker's
    /// [`crate::SnapshotStore`] spills into the same arena).
    pub fn host_tier(&self) -> HostTier {
        self.host.clone()
    }

    /// Waits for the host tier's copies out of `blocks`, if any is still
    /// reading them ([`HostTier::wait_for`]): before they go to a peer that
    /// writes them.
    pub fn wait_host_copies(&mut self, blocks: &[BlockId]) {
        self.host.wait_for(blocks);
    }

    /// Bytes moved by the host tier so far: (to host, back to the pool).
    pub fn host_bytes_moved(&self) -> (u64, u64) {
        self.host.bytes_moved()
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Running requests using `b` (references beyond the cache's own).
    fn running_refs(&self, alloc: &BlockAllocator, b: BlockId) -> u32 {
        alloc.refcount(b) - self.cache_refs[b as usize]
    }

    fn take_ref(&mut self, alloc: &mut BlockAllocator, b: BlockId) {
        alloc.incref(b);
        self.cache_refs[b as usize] += 1;
    }

    fn drop_ref(&mut self, alloc: &mut BlockAllocator, b: BlockId) {
        self.cache_refs[b as usize] -= 1;
        if self.restore_ticket.is_some() {
            self.order_needed = true;
        }
        // A written-back copy serves a session's eviction only: once no
        // session holds the block (the prefix index may still), it goes.
        if self.cache_refs[b as usize] <= u32::from(self.index.contains_block(b)) {
            if let Some(h) = self.mirrors.remove(&b) {
                self.host.release(h);
                self.stats.write_back_blocks.discarded += 1;
            }
        }
        alloc.free(b);
    }

    fn release_loc(&mut self, alloc: &mut BlockAllocator, loc: BlockLoc) {
        match loc {
            BlockLoc::Device(b) => {
                // A superseded block goes to the front of the eviction order.
                self.index.demote(b);
                self.drop_ref(alloc, b)
            }
            BlockLoc::Host(h) => self.host.release(h),
        }
    }

    // ---- requests ---------------------------------------------------------

    /// Finds reusable KV for a new request: the session's committed tokens
    /// (longest common prefix, checked token by token), else whole blocks
    /// of the prefix index. At least the prompt's last token is left to
    /// compute. Host-tier blocks are copied back. A session's blocks past
    /// the common prefix are superseded by this turn and released now.
    /// `root`: the parent of the prompt's first block ([`crate::salt_root`]
    /// of its cache salt; None unsalted): only blocks of the same chain
    /// are found.
    pub fn acquire(
        &mut self,
        session: Option<&str>,
        prompt: &[u32],
        root: Option<BlockHash>,
        alloc: &mut BlockAllocator,
        storage: &mut KvStorage,
    ) -> Acquired {
        self.acquire_at_most(session, prompt, usize::MAX, root, alloc, storage)
    }

    /// [`Self::acquire`], reusing at most `limit` leading tokens (a request
    /// that needs the logits of the positions after them computes those).
    /// The session's turn is opened all the same.
    pub fn acquire_at_most(
        &mut self,
        session: Option<&str>,
        prompt: &[u32],
        limit: usize,
        root: Option<BlockHash>,
        alloc: &mut BlockAllocator,
        storage: &mut KvStorage,
    ) -> Acquired {
        let max_reuse = prompt.len().saturating_sub(1).min(limit);
        let mut out = Acquired { blocks: Vec::new(), tokens: 0, source: ReusePath::Cold, restored_blocks: 0, ready_after: None };
        if let Some(id) = session {
            if !self.sessions.contains_key(id) {
                self.make_room_for_session(id, alloc);
            }
            self.changed.insert(id.to_string());
            let s = self.sessions.entry(id.to_string()).or_default();
            s.busy += 1;
            s.last_use = Instant::now();
            let k = common_prefix(&s.tokens[..], &prompt[..max_reuse]);
            self.reuse_session(id, k, alloc, storage, &mut out);
            if out.tokens > 0 {
                out.source = ReusePath::SessionHit;
                self.stats.session_hits += 1;
            }
        }
        if self.config.enable_prefix_caching {
            let before = out.tokens;
            self.extend_from_index(prompt, max_reuse, root, alloc, &mut out);
            if out.source == ReusePath::Cold && out.tokens > before {
                out.source = ReusePath::PrefixHit;
                self.stats.prefix_hits += 1;
            }
        }
        // Restored blocks are read by this request's first step: where the
        // copies run beside compute, the request waits for them and nothing
        // else does; otherwise everything is ordered after them.
        if out.restored_blocks > 0 && self.host.asynchronous() {
            let ticket = self.host.flush_async();
            self.restore_ticket = Some(ticket);
            out.ready_after = Some(ticket);
        } else {
            self.host.flush();
        }
        self.stats.reused_tokens += out.tokens as u64;
        self.stats.computed_tokens += (prompt.len() - out.tokens) as u64;
        out
    }

    /// Leading blocks of `prompt` that [`Self::acquire`] would hand over
    /// already on the device (the session's, then the prefix index's),
    /// found without side effects: what admission may count on before it
    /// commits to acquiring (host-tier blocks need device blocks to be
    /// copied into, so they are not counted).
    pub fn resident_blocks(&self, session: Option<&str>, prompt: &[u32], root: Option<BlockHash>) -> usize {
        let bs = self.config.block_size;
        let max_reuse = prompt.len().saturating_sub(1);
        let mut n = 0;
        if let Some(s) = session.and_then(|id| self.sessions.get(id)) {
            let full = common_prefix(&s.tokens[..], &prompt[..max_reuse]) / bs;
            n = s.blocks[..full.min(s.blocks.len())].iter().take_while(|l| matches!(l, BlockLoc::Device(_))).count();
            if n < full {
                // acquire stops at the first block it cannot restore; the
                // index is not looked up past a session block on the host.
                return n;
            }
        }
        if self.config.enable_prefix_caching {
            n += block_chain(prompt, max_reuse, bs, root).skip(n).take_while(|(h, blk)| self.index.peek(*h, blk).is_some()).count();
        }
        n
    }

    /// Undoes what [`Self::acquire`] marked and counted for a request that
    /// gave its blocks back without being admitted (the caller frees the
    /// blocks): the session's busy mark (when it took one) and the reuse
    /// counters of that answer.
    /// `source` and `tokens` are the answer's.
    pub fn give_back(&mut self, session: Option<&str>, source: ReusePath, tokens: usize, prompt_len: usize) {
        if let Some(id) = session {
            self.abandon(id);
        }
        let st = &mut self.stats;
        st.reused_tokens = st.reused_tokens.saturating_sub(tokens as u64);
        st.computed_tokens = st.computed_tokens.saturating_sub(prompt_len.saturating_sub(tokens) as u64);
        match source {
            ReusePath::SessionHit => st.session_hits = st.session_hits.saturating_sub(1),
            ReusePath::PrefixHit => st.prefix_hits = st.prefix_hits.saturating_sub(1),
            ReusePath::Cold | ReusePath::Bypass => {}
        }
    }

    fn reuse_session(&mut self, id: &str, k: usize, alloc: &mut BlockAllocator, storage: &mut KvStorage, out: &mut Acquired) {
        let bs = self.config.block_size;
        // Whole blocks only: the block holding position k is rewritten by
        // this turn, so it is recomputed (at most block_size - 1 tokens).
        let full = k / bs;
        // Release the superseded tail now (a newer turn replaces that branch).
        let tail: Vec<BlockLoc> = {
            let s = self.sessions.get_mut(id).expect("session exists");
            let tail = s.blocks.split_off(full.min(s.blocks.len()));
            s.tokens.truncate(full * bs);
            tail
        };
        for loc in tail {
            self.release_loc(alloc, loc);
        }
        for i in 0..full {
            let Some(b) = self.device_block_of(id, i, alloc, storage, out) else {
                break;
            };
            alloc.incref(b);
            out.blocks.push(b);
            out.tokens += bs;
        }
    }

    /// Block `i` of a session on the device, restoring it from the host
    /// tier if needed (None if there is no room).
    fn device_block_of(
        &mut self,
        id: &str,
        i: usize,
        alloc: &mut BlockAllocator,
        storage: &mut KvStorage,
        out: &mut Acquired,
    ) -> Option<BlockId> {
        match self.sessions[id].blocks.get(i).copied()? {
            BlockLoc::Device(b) => Some(b),
            BlockLoc::Host(h) => {
                let dst = self.allocate(1, alloc, storage)?[0];
                self.host.restore(storage, h, dst);
                // The session now holds the device block (the allocation's reference).
                self.cache_refs[dst as usize] += 1;
                self.sessions.get_mut(id).expect("session exists").blocks[i] = BlockLoc::Device(dst);
                self.changed.insert(id.to_string());
                out.restored_blocks += 1;
                self.stats.host_restores += 1;
                Some(dst)
            }
        }
    }

    fn extend_from_index(
        &mut self,
        prompt: &[u32],
        max_reuse: usize,
        root: Option<BlockHash>,
        alloc: &mut BlockAllocator,
        out: &mut Acquired,
    ) {
        let bs = self.config.block_size;
        for (h, blk) in block_chain(prompt, max_reuse, bs, root).skip(out.blocks.len()) {
            let tick = self.next_tick();
            let Some(b) = self.index.lookup(h, blk, tick) else {
                break;
            };
            alloc.incref(b);
            out.blocks.push(b);
            out.tokens += bs;
        }
    }

    /// Allocates, reclaiming cached KV if the pool is short.
    pub fn allocate(&mut self, n: usize, alloc: &mut BlockAllocator, storage: &KvStorage) -> Option<Vec<BlockId>> {
        if alloc.num_free() < n {
            self.reclaim(n, alloc, storage);
        }
        alloc.allocate(n)
    }

    /// Indexes a sequence's newly full block (the index takes a reference).
    /// Returns the block's hash, the parent of the next one.
    pub fn register_block(&mut self, parent: Option<BlockHash>, tokens: &[u32], block: BlockId, alloc: &mut BlockAllocator) -> BlockHash {
        let h = hash_block(parent, tokens);
        if self.config.enable_prefix_caching && !self.index.contains_hash(h) && !self.index.contains_block(block) {
            let tick = self.next_tick();
            self.index.insert(h, tokens, block, tick);
            self.take_ref(alloc, block);
        }
        h
    }

    /// Stores a finished turn in its session: `tokens` (those with KV) and
    /// the blocks covering them. The session takes its own references.
    pub fn commit(&mut self, id: &str, tokens: &[u32], blocks: &[BlockId], alloc: &mut BlockAllocator) {
        let needed = tokens.len().div_ceil(self.config.block_size);
        let blocks = &blocks[..needed.min(blocks.len())];
        for &b in blocks {
            self.take_ref(alloc, b);
        }
        self.changed.insert(id.to_string());
        let old = {
            let s = self.sessions.entry(id.to_string()).or_default();
            s.tokens = tokens[..(blocks.len() * self.config.block_size).min(tokens.len())].to_vec();
            s.turns += 1;
            s.busy = s.busy.saturating_sub(1);
            s.last_use = Instant::now();
            std::mem::replace(&mut s.blocks, blocks.iter().map(|&b| BlockLoc::Device(b)).collect())
        };
        for loc in old {
            self.release_loc(alloc, loc);
        }
    }

    /// A turn ended without committing (cancelled, failed).
    pub fn abandon(&mut self, id: &str) {
        if let Some(s) = self.sessions.get_mut(id) {
            self.changed.insert(id.to_string());
            s.busy = s.busy.saturating_sub(1);
            s.last_use = Instant::now();
        }
    }

    // ---- sessions ---------------------------------------------------------

    pub fn session_info(&self, id: &str) -> Option<SessionInfo> {
        self.sessions.get(id).map(|s| s.info(id))
    }

    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.sessions.iter().map(|(id, s)| s.info(id)).collect()
    }

    /// The sessions changed since the last call, with their current view
    /// (None: deleted). Publishing only these keeps a published map current
    /// in O(changes) per step.
    pub fn take_changed_sessions(&mut self) -> Vec<(String, Option<SessionInfo>)> {
        crate::changes::views_of(std::mem::take(&mut self.changed), |id| self.session_info(id))
    }

    /// Deletes a session and releases its KV. False if unknown.
    pub fn delete(&mut self, id: &str, alloc: &mut BlockAllocator) -> bool {
        let Some(s) = self.sessions.remove(id) else {
            return false;
        };
        self.changed.insert(id.to_string());
        for loc in s.blocks {
            self.release_loc(alloc, loc);
        }
        true
    }

    /// Before `id` is created: when its key's namespace is at
    /// `max_sessions_per_key`, drops that namespace's least recently used
    /// idle session (none when all are busy: the cap is then exceeded until
    /// one ends).
    fn make_room_for_session(&mut self, id: &str, alloc: &mut BlockAllocator) {
        let cap = self.config.max_sessions_per_key;
        if cap == 0 {
            // Decided without gathering the key's sessions.
            kvc_policy::decisions_total::count(&decide_session_cap(0, &[]).1);
            return;
        }
        let key = crate::session_key(id);
        let mine: Vec<(&String, SessionCapCandidate)> = self
            .sessions
            .iter()
            .filter(|(s, _)| crate::session_key(s) == key)
            .map(|(s, sess)| (s, SessionCapCandidate { idle: sess.busy == 0, last_use: sess.last_use }))
            .collect();
        let candidates: Vec<SessionCapCandidate> = mine.iter().map(|(_, c)| *c).collect();
        let (victim, decision) = decide_session_cap(cap, &candidates);
        kvc_policy::log_decision(&decision);
        if let Some(victim) = victim.map(|i| mine[i].0.clone()) {
            let blocks = self.sessions[&victim].blocks.len() as u64;
            self.delete(&victim, alloc);
            self.stats.sessions_capped += 1;
            self.stats.count_eviction("session", "per_key_session_cap", blocks);
            tracing::info!(event = "session_capped", key, dropped = %crate::client_session_id(&victim), cap, "a key's oldest idle session made room for its new one");
        }
    }

    /// Deletes idle sessions unused for longer than the TTL.
    pub fn expire(&mut self, alloc: &mut BlockAllocator) -> usize {
        let ttl = self.config.session_ttl;
        let now = Instant::now();
        let old: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.busy == 0 && now.saturating_duration_since(s.last_use) > ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &old {
            self.delete(id, alloc);
            self.stats.sessions_expired += 1;
        }
        old.len()
    }

    /// Drops every indexed block that no session or request uses.
    pub fn reset_prefix_cache(&mut self, alloc: &mut BlockAllocator) -> usize {
        let blocks: Vec<BlockId> = self.index.lru_blocks(|_| true);
        let mut n = 0;
        for b in blocks {
            if self.index.remove_block(b) {
                self.drop_ref(alloc, b);
                n += 1;
            }
        }
        n
    }

    pub fn host_free_blocks(&self) -> usize {
        self.host.num_free()
    }

    pub fn host_capacity(&self) -> usize {
        self.host.capacity()
    }

    pub fn indexed_blocks(&self) -> usize {
        self.index.len()
    }
}

/// The chained hashes of `prompt`'s whole blocks within its first
/// `max_reuse` tokens, with each block's tokens, in order from `root`.
fn block_chain(prompt: &[u32], max_reuse: usize, bs: usize, root: Option<BlockHash>) -> impl Iterator<Item = (BlockHash, &[u32])> {
    let mut parent = root;
    prompt[..max_reuse.min(prompt.len())].chunks_exact(bs).map(move |blk| {
        let h = hash_block(parent, blk);
        parent = Some(h);
        (h, blk)
    })
}
