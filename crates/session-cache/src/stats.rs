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
    /// Write-back ahead of pressure, in blocks.
    pub write_back_blocks: WriteBackCounts,
}

/// What became of blocks written back to the host tier ahead of pressure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBackCounts {
    /// Copied to the host while staying on the device.
    pub copied: u64,
    /// Later evicted with no copy (the written-back copy took over).
    pub used: u64,
    /// Released unused: the cache let go of the device block (its session
    /// was deleted, dropped or superseded) before any eviction needed it.
    pub discarded: u64,
}

impl CacheStats {
    pub fn count_eviction(&mut self, tier: &str, reason: &str, blocks: u64) {
        if blocks > 0 {
            *self.evictions.entry((tier.to_string(), reason.to_string())).or_insert(0) += blocks;
        }
    }
}
