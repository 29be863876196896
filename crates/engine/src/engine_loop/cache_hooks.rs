//! The scheduler's [`KvManager`] during a step: the block pool with the
//! caches over it (reclaim, reuse at admission, restores in flight), and
//! the role's parts beside them.

use std::collections::HashMap;

use kvc_kv_pool::{BlockAllocator, BlockId, KvStorage};
use kvc_policy::reuse::{decide_reuse, ReuseInputs, ReuseSource};
use kvc_scheduler::{KvManager, SeqId, Sequence};
use kvc_session_cache::{BypassAsk, ReusePath, SessionAwareCache};

use super::prompt_logprobs::reuse_limit;
use super::role_parts::RoleParts;
use super::Active;

/// The scheduler's view of the caches: reclaim cached KV, and find reusable
/// KV for a sequence at admission (a session's first admission uses the
/// session; a re-admission after preemption uses the prefix index).
pub(super) struct CacheHooks<'a> {
    pub(super) alloc: &'a mut BlockAllocator,
    pub(super) cache: &'a mut SessionAwareCache,
    pub(super) storage: &'a mut KvStorage,
    pub(super) active: &'a mut HashMap<SeqId, Active>,
    pub(super) parts: &'a mut RoleParts,
}

impl KvManager for CacheHooks<'_> {
    fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }

    fn num_free(&self) -> usize {
        self.alloc.num_free()
    }

    fn allocate(&mut self, _seq: SeqId, n: usize) -> Option<Vec<BlockId>> {
        if self.alloc.num_free() < n {
            self.reclaim(n);
        }
        self.alloc.allocate(n)
    }

    fn free(&mut self, blocks: &[BlockId]) {
        self.alloc.free_all(blocks);
    }

    fn reclaim(&mut self, n: usize) {
        let alloc = &mut *self.alloc;
        self.cache.reclaim(n, alloc, self.storage);
        if alloc.num_free() < n {
            // The role's parts give way to the prompts it must compute.
            self.parts.reclaim(n, alloc, self.storage);
        }
    }

    /// Gathers what each source offers the sequence (the session cache's
    /// answer, acquired as it is given: it opens the session's turn; the
    /// snapshot's cover, asked first), acts on [`decide_reuse`]'s choice and
    /// logs it.
    fn computed_blocks(&mut self, seq: &Sequence) -> Option<(Vec<BlockId>, usize)> {
        let alloc = &mut *self.alloc;
        let a = self.active.get_mut(&seq.id)?;
        let session = if a.turn_open { None } else { a.session_id.clone() };
        let (limit, why) = reuse_limit(a.scoring.as_ref(), seq.prompt_len);
        if limit < seq.tokens.len() {
            tracing::debug!(event = "reuse_limit", seq_id = seq.id, limit, reason = why);
        }
        let mut got = self.cache.acquire_at_most(session.as_deref(), &seq.tokens, limit, a.cache_root, alloc, self.storage);
        a.turn_open |= session.is_some();
        a.cache_answer = Some((got.source, got.tokens));
        // A prefill worker's request for a session may reuse its snapshot
        // instead (prefill bypass), restored from the host tier if it was
        // demoted.
        let snapshot = a.snapshot_session.clone();
        let offers = ReuseInputs {
            cache_source: got.source.into(),
            cache_tokens: got.tokens,
            snapshot_tokens: snapshot.as_deref().and_then(|s| self.parts.snapshot_covers(s, &seq.tokens)),
            limit: (limit < usize::MAX).then_some(limit),
        };
        let (mut source, mut decision) = decide_reuse(&offers);
        if let Some(s) = snapshot.as_deref().filter(|_| offers.snapshot_tokens.is_some() && offers.limit.is_none()) {
            if source == ReuseSource::Bypass {
                match self.parts.reuse(BypassAsk { session: s, prompt: &seq.tokens, min_tokens: got.tokens }, alloc, self.storage) {
                    Some((blocks, tokens)) => {
                        alloc.free_all(&got.blocks);
                        got.blocks = blocks;
                        got.tokens = tokens;
                        got.ready_after = None;
                    }
                    // The host tier could not restore enough of it: the
                    // snapshot served nothing (counted as a miss there).
                    None => (source, decision) = decide_reuse(&ReuseInputs { snapshot_tokens: Some(0), ..offers }),
                }
            } else {
                self.parts.bypass_missed(s);
            }
        }
        kvc_policy::log_decision(&decision);
        a.reuse_reason = source.into();
        a.cached_tokens = got.tokens;
        a.restored_blocks += got.restored_blocks;
        // A restore of an earlier acquire that was given back may still be
        // copying into blocks handed out again now: wait for both.
        a.restore_ticket = got.ready_after.max(a.restore_ticket);
        a.registered_blocks = 0;
        a.last_hash = a.cache_root;
        tracing::debug!(event = "reuse", seq_id = seq.id, session = ?a.session_id, reused = got.tokens, reason = a.reuse_reason.as_str(), restored = got.restored_blocks);
        (got.tokens > 0).then_some((got.blocks, got.tokens))
    }

    fn release(&mut self, seq: &Sequence) {
        let Some(a) = self.active.get_mut(&seq.id) else { return };
        let session = if std::mem::replace(&mut a.turn_open, false) { a.session_id.as_deref() } else { None };
        let (source, tokens) = a.cache_answer.take().unwrap_or_default();
        self.cache.give_back(session, source, tokens, seq.tokens.len());
        a.cached_tokens = 0;
        a.reuse_reason = ReusePath::Cold;
        tracing::debug!(event = "give_back", seq_id = seq.id, session = ?a.session_id, reused = tokens, "a waiting request gave its reused KV back");
    }

    fn resident_blocks(&mut self, seq: &Sequence) -> usize {
        let Some(a) = self.active.get(&seq.id) else { return 0 };
        let session = if a.turn_open { None } else { a.session_id.as_deref() };
        // What acquire_at_most would hand over: at most `limit` tokens.
        let limit = reuse_limit(a.scoring.as_ref(), seq.prompt_len).0;
        let upto = seq.tokens.len().min(limit.saturating_add(1));
        self.cache.resident_blocks(session, &seq.tokens[..upto], a.cache_root)
    }

    fn reclaimable(&mut self) -> usize {
        let alloc = &*self.alloc;
        self.cache.evictable_blocks(alloc) + self.parts.held_blocks()
    }

    fn ready(&mut self, id: SeqId) -> bool {
        let Some(a) = self.active.get_mut(&id) else { return true };
        match a.restore_ticket {
            Some(t) if !self.cache.copies_done(t) => false,
            _ => {
                a.restore_ticket = None;
                true
            }
        }
    }
}
