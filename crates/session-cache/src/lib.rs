//! SessionAwareCache: a session's KV kept across turns, a prefix cache for
//! every request, and block-granular tiered eviction (unreferenced cached
//! blocks, then idle sessions to host memory, then drop), with the victim
//! chosen by one explicit cost function. A prefill worker's snapshot store,
//! tiered the same way over the same host tier.

mod block_hash;
mod cache;
mod changes;
mod host_tier;
mod namespace;
mod prefix_index;
mod reuse_path;
mod session;
mod snapshot_store;
mod stats;
#[cfg(test)]
mod test_arena;

pub use block_hash::{hash_block, hash_blocks, salt_root, BlockHash};
pub use cache::{Acquired, CacheConfig, SessionAwareCache};
// The eviction and write-back decisions live in kvc-policy (issue 32);
// re-exported under their old names so callers keep compiling.
pub use host_tier::{HostBlockId, HostTier};
pub use kvc_policy::eviction::{
    decide_eviction as choose_victim, EvictionAction, EvictionCandidate, EvictionCandidate as VictimCandidate, EvictionDecision,
    EvictionReason,
};
pub use kvc_policy::write_back::{decide_write_back, WriteBack, WriteBackInputs, WriteBackSkip};
pub use namespace::{client_session_id, is_valid_client_part, scoped_session_id, session_key};
pub use reuse_path::ReusePath;
pub use session::{common_prefix, SessionInfo, Tier};
pub use snapshot_store::{
    decide_spill, BypassAsk, SnapshotError, SnapshotInfo, SnapshotReservation, SnapshotStats, SnapshotStore, SpillAction, SpillDecision,
    SpillInputs, SpillReason,
};
pub use stats::{CacheStats, WriteBackCounts};
