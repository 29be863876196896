//! The eviction pass of [`SessionAwareCache`]: what [`SessionAwareCache::reclaim`]
//! frees, in order (unreferenced indexed blocks, then idle sessions to the
//! host tier, then dropped), the victim chosen by [`decide_eviction`]. A
//! block that write-back already copied ([`super::write_back`]) goes to the
//! host tier with no copy.

use std::time::Instant;

use kvc_kv_pool::{BlockAllocator, BlockId, KvStorage};
use kvc_policy::eviction::{decide_eviction, EvictionAction, EvictionCandidate, EvictionDecision};
use kvc_policy::host_drop::{decide_host_drop, HostDropCandidate};

use super::SessionAwareCache;
use crate::session::BlockLoc;

impl SessionAwareCache {
    /// Blocks that eviction could free now (indexed or held by idle
    /// sessions, with no running user).
    pub fn evictable_blocks(&self, alloc: &BlockAllocator) -> usize {
        (0..self.cache_refs.len() as BlockId).filter(|&b| self.cache_refs[b as usize] > 0 && self.running_refs(alloc, b) == 0).count()
    }

    /// Frees device blocks until `need` are free or nothing more can go:
    /// 1. indexed blocks nobody else uses (LRU), 2. idle sessions' blocks to
    /// the host tier (victim by [`decide_eviction`]), 3. drop the victim.
    pub fn reclaim(&mut self, need: usize, alloc: &mut BlockAllocator, storage: &KvStorage) -> usize {
        let start = alloc.num_free();
        while alloc.num_free() < need {
            if self.evict_index_only(need - alloc.num_free(), alloc) > 0 {
                continue;
            }
            let Some(decision) = self.pick_victim(alloc) else {
                break;
            };
            if decision.action == EvictionAction::Drop && self.host.capacity() > 0 {
                // Make room in the host tier from older host-resident sessions first.
                if self.drop_coldest_host_session(&decision.session, alloc) {
                    continue;
                }
            }
            let moved = self.evict_session(&decision, alloc, storage);
            tracing::info!(
                event = "eviction",
                session = %decision.session,
                action = ?decision.action,
                reason = decision.reason.as_str(),
                score = decision.score,
                blocks = moved,
                "evicted idle session KV"
            );
            if moved == 0 {
                break;
            }
        }
        // Blocks offloaded above are free now: their copies (and write-back
        // copies still running) come first.
        self.host.flush();
        alloc.num_free() - start
    }

    fn evict_index_only(&mut self, want: usize, alloc: &mut BlockAllocator) -> usize {
        let cache_refs = &self.cache_refs;
        let victims = self.index.lru_blocks(|b| cache_refs[b as usize] == 1 && alloc.refcount(b) == 1);
        let mut freed = 0;
        for b in victims.into_iter().take(want) {
            self.index.remove_block(b);
            self.drop_ref(alloc, b);
            freed += 1;
        }
        if freed > 0 {
            self.stats.count_eviction("device", "prefix_lru", freed as u64);
            tracing::debug!(event = "eviction", tier = "device", reason = "prefix_lru", blocks = freed);
        }
        freed
    }

    /// What the eviction cost function knows of each idle session: its
    /// device blocks that no request uses, and how many of those are
    /// written back already.
    pub(super) fn idle_candidates(&self, alloc: &BlockAllocator) -> Vec<EvictionCandidate> {
        let now = Instant::now();
        self.sessions
            .iter()
            .filter(|(_, s)| s.busy == 0)
            .map(|(id, s)| {
                let free_later = s.blocks.iter().filter_map(|l| match *l {
                    BlockLoc::Device(b) if self.running_refs(alloc, b) == 0 => Some(b),
                    _ => None,
                });
                let (device_blocks, mirrored) =
                    free_later.fold((0, 0), |(n, m), b| (n + 1, m + usize::from(self.mirrors.contains_key(&b))));
                EvictionCandidate {
                    session: id.clone(),
                    idle_s: now.saturating_duration_since(s.last_use).as_secs_f64(),
                    device_blocks,
                    turns: s.turns,
                    mirrored,
                }
            })
            .collect()
    }

    fn pick_victim(&self, alloc: &BlockAllocator) -> Option<EvictionDecision> {
        decide_eviction(&self.idle_candidates(alloc), self.host.num_free(), alloc.num_blocks())
    }

    /// Offloads (or drops) a session's device blocks that no request uses.
    fn evict_session(&mut self, d: &EvictionDecision, alloc: &mut BlockAllocator, storage: &KvStorage) -> usize {
        let locs = self.sessions[&d.session].blocks.clone();
        self.changed.insert(d.session.clone());
        kvc_policy::log_decision(&d.decision());
        let mut moved = 0;
        match d.action {
            EvictionAction::Offload => {
                // The tail first when the tier cannot take them all (the
                // head stays, as a prefix); copied in token order, so that
                // consecutive blocks go to consecutive slots. Blocks written
                // back already need neither a copy nor a new slot.
                let mut slots = self.host.num_free();
                let movable: Vec<(usize, BlockId)> = locs
                    .iter()
                    .enumerate()
                    .rev()
                    .filter_map(|(i, loc)| match *loc {
                        BlockLoc::Device(b) if self.running_refs(alloc, b) == 0 => Some((i, b)),
                        _ => None,
                    })
                    .take_while(|(_, b)| {
                        let fits = self.mirrors.contains_key(b) || slots > 0;
                        if !self.mirrors.contains_key(b) {
                            slots = slots.saturating_sub(1);
                        }
                        fits
                    })
                    .collect();
                for (i, b) in movable.into_iter().rev() {
                    let h = match self.mirrors.remove(&b) {
                        Some(h) => {
                            self.stats.write_back_blocks.used += 1;
                            h
                        }
                        None => self.host.store(storage, b).expect("counted free host slots"),
                    };
                    self.sessions.get_mut(&d.session).expect("victim exists").blocks[i] = BlockLoc::Host(h);
                    self.drop_ref(alloc, b);
                    moved += 1;
                }
                self.stats.count_eviction(d.action.tier(), d.reason.as_str(), moved as u64);
            }
            EvictionAction::Drop => {
                let s = self.sessions.get_mut(&d.session).expect("victim exists");
                let blocks = std::mem::take(&mut s.blocks);
                s.tokens.clear();
                moved = blocks.iter().filter(|l| matches!(l, BlockLoc::Device(_))).count();
                for loc in blocks {
                    self.release_loc(alloc, loc);
                }
                self.stats.count_eviction(d.action.tier(), d.reason.as_str(), moved as u64);
            }
        }
        moved
    }

    /// Drops the KV of the idle session with host blocks that has been idle
    /// longest (other than `except`). False if there is none.
    fn drop_coldest_host_session(&mut self, except: &str, alloc: &mut BlockAllocator) -> bool {
        let ids: Vec<&String> = self.sessions.keys().collect();
        let candidates: Vec<HostDropCandidate> = ids
            .iter()
            .map(|id| {
                let s = &self.sessions[*id];
                HostDropCandidate {
                    idle: s.busy == 0,
                    is_requester: id.as_str() == except,
                    on_host: s.blocks.iter().any(|l| matches!(l, BlockLoc::Host(_))),
                    last_use: s.last_use,
                }
            })
            .collect();
        let (victim, decision) = decide_host_drop(&candidates);
        kvc_policy::log_decision(&decision);
        let Some(id) = victim.map(|i| ids[i].clone()) else { return false };
        self.changed.insert(id.clone());
        let s = self.sessions.get_mut(&id).expect("victim exists");
        let blocks = std::mem::take(&mut s.blocks);
        s.tokens.clear();
        let n = blocks.len() as u64;
        for loc in blocks {
            self.release_loc(alloc, loc);
        }
        self.stats.count_eviction("dropped", "host_full", n);
        tracing::info!(event = "eviction", session = %id, action = "drop", reason = "host_full", blocks = n);
        true
    }
}
