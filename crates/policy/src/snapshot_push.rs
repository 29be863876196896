//! Whether a decode worker pushes a session's snapshot to its prefill
//! worker after a committed turn, by [`decide_snapshot_push`]: when no push
//! of it is in flight and at least `min_tokens` tokens (whole blocks) are
//! new since its last push. Counted as
//! `kvc_decisions_total{decision="snapshot_push"}` (the pushes queued also
//! as `kvc_snapshot_push_enqueued_total`).

use crate::decision::{Decision, Reason};

#[derive(Debug, Clone, Copy)]
pub struct SnapshotPushInputs {
    /// A push of this session is in flight.
    pub in_flight: bool,
    /// Full blocks of the session now.
    pub blocks: usize,
    /// Of them, how many its last push already holds.
    pub pushed_blocks: usize,
    pub block_size: usize,
    pub min_tokens: usize,
}

crate::decision::reasons! {
    /// Why [`decide_snapshot_push`] pushes a snapshot or skips it.
    pub enum SnapshotPushReason in "snapshot_push" {
        /// At least `min_tokens` tokens are new since the last push.
        NewTokens("new_tokens") => "push",
        /// A push of this session is in flight.
        InFlight("in_flight") => "skip",
        /// Too few tokens are new since the last push.
        TooFewNewTokens("too_few_new_tokens") => "skip",
    }
}

pub fn decide_snapshot_push(i: &SnapshotPushInputs) -> Decision<SnapshotPushReason> {
    let new_tokens = i.blocks.saturating_sub(i.pushed_blocks) * i.block_size;
    let reason = if i.in_flight {
        SnapshotPushReason::InFlight
    } else if new_tokens >= i.min_tokens {
        SnapshotPushReason::NewTokens
    } else {
        SnapshotPushReason::TooFewNewTokens
    };
    Decision::new(reason.outcomes()[0], reason).term("new_tokens", new_tokens as f64).term("min_tokens", i.min_tokens as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_is_due_for_enough_new_tokens_and_none_in_flight() {
        let i = SnapshotPushInputs { in_flight: false, blocks: 4, pushed_blocks: 2, block_size: 16, min_tokens: 32 };
        let d = decide_snapshot_push(&i);
        assert_eq!((d.outcome, d.reason), ("push", SnapshotPushReason::NewTokens));
        assert_eq!(decide_snapshot_push(&SnapshotPushInputs { in_flight: true, ..i }).reason, SnapshotPushReason::InFlight);
        let few = SnapshotPushInputs { pushed_blocks: 3, ..i };
        assert_eq!((decide_snapshot_push(&few).outcome, decide_snapshot_push(&few).reason), ("skip", SnapshotPushReason::TooFewNewTokens));
    }
}
