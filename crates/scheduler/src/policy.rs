//! The scheduler's two decisions, each one function returning the decision
//! and its reason: whether the next waiting sequence is admitted, and which
//! running sequence is preempted when a running one needs a block and no
//! cache is left to reclaim. The planner (scheduler.rs) emits them as
//! `event="admission"` / `event="preempt"` and counts them.

use crate::sequence::SeqId;

/// Why a waiting sequence was or was not admitted in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AdmitReason {
    Admitted,
    /// `max_num_seqs` sequences are running.
    MaxNumSeqs,
    /// Its blocks plus the reserve for running sequences' growth are not
    /// free, even after reclaiming caches.
    KvWatermark,
    /// `max_num_partial_prefills` sequences are mid-prefill.
    PartialPrefills,
    /// It is long and `max_long_partial_prefills` long ones are mid-prefill
    /// (shorter prompts behind it may go first).
    LongPartialPrefills,
    /// The step's token budget is spent.
    TokenBudget,
}

impl AdmitReason {
    /// Every reason, for label sets exported at 0.
    pub const ALL: [AdmitReason; 6] = [
        AdmitReason::Admitted,
        AdmitReason::MaxNumSeqs,
        AdmitReason::KvWatermark,
        AdmitReason::PartialPrefills,
        AdmitReason::LongPartialPrefills,
        AdmitReason::TokenBudget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AdmitReason::Admitted => "admitted",
            AdmitReason::MaxNumSeqs => "max_num_seqs",
            AdmitReason::KvWatermark => "kv_watermark",
            AdmitReason::PartialPrefills => "partial_prefills",
            AdmitReason::LongPartialPrefills => "long_partial_prefills",
            AdmitReason::TokenBudget => "token_budget",
        }
    }

    /// What a sequence held back for this reason is waiting for: capacity
    /// (memory, sequence slots) or its turn behind other prefills.
    pub fn wait(self) -> Wait {
        match self {
            AdmitReason::MaxNumSeqs | AdmitReason::KvWatermark => Wait::Admission,
            _ => Wait::Prefill,
        }
    }
}

/// What a sequence that computes nothing in a step is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Memory or a sequence slot: "waiting for admission".
    Admission,
    /// A prefill slot or step budget: "waiting behind other prefills".
    Prefill,
}

/// The state an admission is judged on.
#[derive(Debug, Clone, Copy)]
pub struct AdmitInputs {
    pub running: usize,
    pub max_num_seqs: usize,
    pub partial_prefills: usize,
    pub max_num_partial_prefills: usize,
    pub long_partial_prefills: usize,
    pub max_long_partial_prefills: usize,
    pub is_long: bool,
    pub budget_left: usize,
    /// Blocks the sequence still needs for its whole token list.
    pub need_blocks: usize,
    /// Free blocks (after reclaiming caches where that was needed).
    pub free_blocks: usize,
    /// Blocks kept for running sequences' growth.
    pub reserve_blocks: usize,
}

/// Admit when a sequence slot, a prefill slot (a long one for a long
/// prompt) and budget are there, and the whole prompt's blocks fit beside
/// the reserve: admitted prompts then never need a block mid-prefill, so
/// admitting never forces a preemption later.
pub fn decide_admission(i: &AdmitInputs) -> AdmitReason {
    if i.running >= i.max_num_seqs {
        AdmitReason::MaxNumSeqs
    } else if i.partial_prefills >= i.max_num_partial_prefills {
        AdmitReason::PartialPrefills
    } else if i.is_long && i.long_partial_prefills >= i.max_long_partial_prefills {
        AdmitReason::LongPartialPrefills
    } else if i.budget_left == 0 {
        AdmitReason::TokenBudget
    } else if i.need_blocks + i.reserve_blocks > i.free_blocks {
        AdmitReason::KvWatermark
    } else {
        AdmitReason::Admitted
    }
}

/// A running sequence that could be preempted.
#[derive(Debug, Clone, Copy)]
pub struct VictimCandidate {
    pub id: SeqId,
    /// Tokens whose KV it would lose (recomputed on re-admission unless a
    /// cache still holds them).
    pub computed: usize,
    pub arrival: u64,
}

/// The candidate whose preemption wastes least: fewest computed tokens,
/// the newest among equals. None when there is no candidate.
pub fn choose_victim(candidates: &[VictimCandidate]) -> Option<(SeqId, &'static str)> {
    candidates
        .iter()
        .min_by_key(|c| (c.computed, std::cmp::Reverse(c.arrival)))
        .map(|c| (c.id, if c.computed == 0 { "nothing_computed" } else { "least_computed" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> AdmitInputs {
        AdmitInputs {
            running: 1,
            max_num_seqs: 4,
            partial_prefills: 0,
            max_num_partial_prefills: 2,
            long_partial_prefills: 0,
            max_long_partial_prefills: 1,
            is_long: false,
            budget_left: 100,
            need_blocks: 10,
            free_blocks: 12,
            reserve_blocks: 2,
        }
    }

    #[test]
    fn each_limit_has_its_reason() {
        assert_eq!(decide_admission(&inputs()), AdmitReason::Admitted);
        assert_eq!(decide_admission(&AdmitInputs { running: 4, ..inputs() }), AdmitReason::MaxNumSeqs);
        assert_eq!(decide_admission(&AdmitInputs { partial_prefills: 2, ..inputs() }), AdmitReason::PartialPrefills);
        let long = AdmitInputs { is_long: true, long_partial_prefills: 1, ..inputs() };
        assert_eq!(decide_admission(&long), AdmitReason::LongPartialPrefills);
        assert_eq!(decide_admission(&AdmitInputs { is_long: false, ..long }), AdmitReason::Admitted);
        assert_eq!(decide_admission(&AdmitInputs { budget_left: 0, ..inputs() }), AdmitReason::TokenBudget);
        assert_eq!(decide_admission(&AdmitInputs { free_blocks: 11, ..inputs() }), AdmitReason::KvWatermark);
    }

    #[test]
    fn the_victim_is_the_one_with_least_to_recompute() {
        let c = |id, computed, arrival| VictimCandidate { id, computed, arrival };
        assert_eq!(choose_victim(&[c(1, 500, 0), c(2, 40, 1), c(3, 900, 2)]), Some((2, "least_computed")));
        assert_eq!(choose_victim(&[c(1, 0, 0), c(2, 0, 5)]), Some((2, "nothing_computed")));
        assert_eq!(choose_victim(&[]), None);
    }
}
