//! Which idle session loses its device blocks when the session cache must
//! free some, and whether they go to the host tier or are dropped, by
//! [`decide_eviction`]: the one cost function of eviction (write-back ahead
//! of pressure asks it whose blocks go first as well). The blocks it frees
//! are counted as `kvc_evicted_blocks_total{tier,reason}`, every pair of
//! [`EvictionReason::pairs`] exported at 0 (beside the label sets of
//! evictions made without this decision: the prefix index's LRU, the host
//! tier's room, the per-key session cap).

/// What the policy knows about one idle session.
#[derive(Debug, Clone)]
pub struct EvictionCandidate {
    pub session: String,
    /// Seconds since the session's last turn ended.
    pub idle_s: f64,
    /// Device blocks that eviction would actually free (not shared with running requests).
    pub device_blocks: usize,
    /// Turns the session has completed (more turns: more likely to return).
    pub turns: u32,
    /// Of `device_blocks`, those already copied to the host tier by
    /// write-back (offloading them needs no copy and no new host slot).
    pub mirrored: usize,
}

crate::decision::reasons! {
    /// What happens to the victim's device blocks: the `outcome` label.
    pub enum EvictionAction {
        /// Copy to the host tier, free the device blocks.
        Offload("offload"),
        /// Free without a copy (host tier full or disabled).
        Drop("drop"),
    }
}

impl EvictionAction {
    /// The `tier` label of `kvc_evicted_blocks_total`: where the blocks went.
    pub fn tier(self) -> &'static str {
        match self {
            EvictionAction::Offload => "host",
            EvictionAction::Drop => "dropped",
        }
    }
}

crate::decision::reasons! {
    /// The dominant term of the victim's score.
    pub enum EvictionReason in "eviction" {
        /// Idle for long: it may not come back soon.
        Idle("idle"),
        /// Large: freeing it helps most.
        Size("size"),
        /// Few turns: sessions that ran many keep coming back.
        FewTurns("few_turns"),
    }
    // Either action with any reason ([`EvictionAction::as_str`]).
    outcomes = |_r| &["offload", "drop"]
}

impl EvictionReason {
    /// Every (action, reason) pair a decision can be (either action with
    /// any reason): the counter's label sets, through
    /// [`EvictionAction::tier`].
    pub fn pairs() -> impl Iterator<Item = (EvictionAction, EvictionReason)> {
        EvictionAction::ALL.into_iter().flat_map(|a| EvictionReason::ALL.into_iter().map(move |r| (a, r)))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EvictionDecision {
    pub session: String,
    pub action: EvictionAction,
    pub score: f64,
    /// The dominant term.
    pub reason: EvictionReason,
}

/// Expected cost of losing a session's device KV is low when it has been
/// idle for long (it may not come back soon), when it is large (freeing it
/// helps most) and when it has had few turns (agent sessions that have run
/// many turns keep coming back). Score = idle term + size term + turn term;
/// the highest score is evicted (the smallest session id among equal
/// scores). Sessions with nothing to free are never chosen; the victim is
/// offloaded when the host tier has room for its blocks not yet written
/// back, else dropped.
pub fn decide_eviction(candidates: &[EvictionCandidate], host_free_blocks: usize, pool_blocks: usize) -> Option<EvictionDecision> {
    let pool = pool_blocks.max(1) as f64;
    candidates
        .iter()
        .filter(|c| c.device_blocks > 0)
        .map(|c| {
            let idle = (c.idle_s / 10.0).min(10.0);
            let size = c.device_blocks as f64 / pool * 2.0;
            let few_turns = 1.0 / (1.0 + c.turns as f64);
            let score = idle + size + few_turns;
            let reason = if idle >= size && idle >= few_turns {
                EvictionReason::Idle
            } else if size >= few_turns {
                EvictionReason::Size
            } else {
                EvictionReason::FewTurns
            };
            let action = if host_free_blocks >= c.device_blocks - c.mirrored { EvictionAction::Offload } else { EvictionAction::Drop };
            EvictionDecision { session: c.session.clone(), action, score, reason }
        })
        .max_by(|a, b| a.score.total_cmp(&b.score).then_with(|| b.session.cmp(&a.session)))
}

impl EvictionDecision {
    pub fn decision(&self) -> crate::decision::Decision<EvictionReason> {
        crate::decision::Decision::new(self.action.as_str(), self.reason).term("score", self.score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn c(s: &str, idle_s: f64, blocks: usize, turns: u32) -> EvictionCandidate {
        EvictionCandidate { session: s.into(), idle_s, device_blocks: blocks, turns, mirrored: 0 }
    }

    #[test]
    fn the_longest_idle_session_goes_first() {
        let d = decide_eviction(&[c("a", 1.0, 10, 3), c("b", 60.0, 10, 3)], 100, 100).unwrap();
        assert_eq!((d.session.as_str(), d.reason), ("b", EvictionReason::Idle));
        assert_eq!(d.action, EvictionAction::Offload);
    }

    #[test]
    fn without_host_room_the_victim_is_dropped() {
        let d = decide_eviction(&[c("a", 5.0, 10, 1)], 3, 100).unwrap();
        assert_eq!(d.action, EvictionAction::Drop);
    }

    #[test]
    fn sessions_with_nothing_to_free_are_never_chosen() {
        assert!(decide_eviction(&[c("a", 100.0, 0, 0)], 10, 10).is_none());
    }

    #[test]
    fn mirrored_blocks_need_no_host_room_to_offload() {
        let mut cand = c("a", 5.0, 10, 1);
        cand.mirrored = 8;
        assert_eq!(decide_eviction(&[cand], 2, 100).unwrap().action, EvictionAction::Offload);
    }

    #[test]
    fn equal_scores_go_to_the_smallest_session_id() {
        let d = decide_eviction(&[c("b", 5.0, 10, 1), c("a", 5.0, 10, 1), c("c", 5.0, 10, 1)], 100, 100).unwrap();
        assert_eq!(d.session, "a");
    }

    #[test]
    fn the_score_is_the_sum_of_the_terms_and_the_reason_the_largest() {
        // idle 0.5, size 10/100*2 = 0.2, turns 1/(1+1) = 0.5: idle wins its tie.
        let d = decide_eviction(&[c("a", 5.0, 10, 1)], 100, 100).unwrap();
        assert!((d.score - 1.2).abs() < 1e-12, "{d:?}");
        assert_eq!(d.reason, EvictionReason::Idle);
        // size 1.6 over idle 0.1 and turns 0.25.
        assert_eq!(decide_eviction(&[c("a", 1.0, 80, 3)], 100, 100).unwrap().reason, EvictionReason::Size);
        // turns 1 over idle 0 and size 0.02.
        assert_eq!(decide_eviction(&[c("a", 0.0, 1, 0)], 100, 100).unwrap().reason, EvictionReason::FewTurns);
        // The idle term is capped at 10.
        assert!((decide_eviction(&[c("a", 1e9, 1, 0)], 100, 100).unwrap().score - 11.02).abs() < 1e-12);
    }

    /// Every (action, reason) pair is reached over a grid, no decision
    /// falls outside the table, and the labels are today's.
    #[test]
    fn every_pair_is_reachable_and_decisions_stay_in_the_table_with_todays_labels() {
        let table: HashSet<_> = EvictionReason::pairs().collect();
        assert_eq!(table.len(), 6);
        let mut seen = HashSet::new();
        for idle_s in [0.0, 5.0, 60.0, 1e9] {
            for blocks in [1, 10, 80] {
                for turns in [0, 1, 3, 50] {
                    for host_free in [0, 5, 100] {
                        let d = decide_eviction(&[c("a", idle_s, blocks, turns)], host_free, 100).expect("blocks to free");
                        assert!(table.contains(&(d.action, d.reason)), "{d:?} outside the label table");
                        seen.insert((d.action, d.reason));
                    }
                }
            }
        }
        assert_eq!(seen, table);
        let reasons: Vec<_> = EvictionReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(reasons, ["idle", "size", "few_turns"]);
        let tiers: Vec<_> = EvictionAction::ALL.iter().map(|a| a.tier()).collect();
        assert_eq!(tiers, ["host", "dropped"]);
        let actions: Vec<_> = EvictionAction::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(actions, ["offload", "drop"]);
    }
}
