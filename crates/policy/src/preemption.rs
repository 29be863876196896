//! Which running sequence the scheduler preempts (its KV freed, recomputed
//! later) when a running sequence needs a block and no cache is left to
//! reclaim, by [`decide_preemption`]. The planner logs it as
//! `event="preempt"` with the reason; `kvc_preemptions_total` counts
//! preemptions without a reason label.

/// A running sequence that could be preempted.
#[derive(Debug, Clone, Copy)]
pub struct PreemptionCandidate {
    /// The scheduler's sequence id (`kvc_scheduler::SeqId`).
    pub id: u64,
    /// Tokens whose KV it would lose (recomputed on re-admission unless a
    /// cache still holds them).
    pub computed: usize,
    pub arrival: u64,
}

crate::decision::reasons! {
    /// Why [`decide_preemption`] chose its victim.
    pub enum PreemptionReason in "preemption" {
        /// The victim has computed nothing yet: preempting it wastes no work.
        NothingComputed("nothing_computed") => "preempt",
        /// The victim has the fewest computed tokens (the newest among equals).
        LeastComputed("least_computed") => "preempt",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreemptionDecision {
    /// The preempted sequence's id.
    pub victim: u64,
    pub reason: PreemptionReason,
}

/// The candidate whose preemption wastes least: fewest computed tokens,
/// the newest among equals (the first listed among exact ties). None when
/// there is no candidate.
pub fn decide_preemption(candidates: &[PreemptionCandidate]) -> Option<PreemptionDecision> {
    candidates.iter().min_by_key(|c| (c.computed, std::cmp::Reverse(c.arrival))).map(|c| PreemptionDecision {
        victim: c.id,
        reason: if c.computed == 0 { PreemptionReason::NothingComputed } else { PreemptionReason::LeastComputed },
    })
}

impl PreemptionDecision {
    pub fn decision(&self) -> crate::decision::Decision<PreemptionReason> {
        crate::decision::Decision::new("preempt", self.reason).term("victim", self.victim as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn c(id: u64, computed: usize, arrival: u64) -> PreemptionCandidate {
        PreemptionCandidate { id, computed, arrival }
    }

    fn decide(candidates: &[PreemptionCandidate]) -> Option<(u64, PreemptionReason)> {
        decide_preemption(candidates).map(|d| (d.victim, d.reason))
    }

    #[test]
    fn the_victim_is_the_one_with_least_to_recompute() {
        assert_eq!(decide(&[c(1, 500, 0), c(2, 40, 1), c(3, 900, 2)]), Some((2, PreemptionReason::LeastComputed)));
        assert_eq!(decide(&[c(1, 0, 0), c(2, 0, 5)]), Some((2, PreemptionReason::NothingComputed)));
        assert_eq!(decide(&[]), None);
    }

    #[test]
    fn ties_go_to_the_newest_then_the_first_listed() {
        assert_eq!(decide(&[c(1, 40, 9), c(2, 40, 3)]), Some((1, PreemptionReason::LeastComputed)));
        assert_eq!(decide(&[c(7, 40, 3), c(8, 40, 3)]), Some((7, PreemptionReason::LeastComputed)));
    }

    #[test]
    fn every_reason_is_reachable_with_todays_labels() {
        let mut seen = HashSet::new();
        for a in [0, 1, 500] {
            for b in [0, 1, 500] {
                seen.insert(decide_preemption(&[c(1, a, 0), c(2, b, 1)]).expect("two candidates").reason);
            }
        }
        assert_eq!(seen, HashSet::from(PreemptionReason::ALL));
        let labels: Vec<_> = PreemptionReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["nothing_computed", "least_computed"]);
    }
}
