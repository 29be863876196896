//! Counters of the cache's decisions (exported as Prometheus metrics).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub session_hits: u64,
    pub prefix_hits: u64,
    /// Prompt tokens served from cached KV.
    pub reused_tokens: u64,
    /// Prompt tokens that had to be computed.
    pub computed_tokens: u64,
    pub host_restores: u64,
    pub sessions_expired: u64,
    /// Idle sessions dropped to keep a key under `max_sessions_per_key`.
    pub sessions_capped: u64,
    /// Evicted blocks by (tier, reason).
    pub evictions: BTreeMap<(String, String), u64>,
}

impl CacheStats {
    pub fn count_eviction(&mut self, tier: &str, reason: &str, blocks: u64) {
        if blocks > 0 {
            *self.evictions.entry((tier.to_string(), reason.to_string())).or_insert(0) += blocks;
        }
    }
}
