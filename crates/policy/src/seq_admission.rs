//! Whether the scheduler admits the next waiting sequence in a step, by
//! [`decide_seq_admission`] (not the engine's admission probe, which
//! answers `POST /admission` before a request is submitted). Counted as
//! `kvc_decisions_total{decision="seq_admission"}`, every reason of
//! [`AdmitReason::ALL`] exported at 0; the planner logs it as
//! `event="admission"`.
//!
//! A waiting sequence is admitted when a sequence slot, a prefill slot (a
//! long one for a long prompt) and step budget are there, and the whole
//! prompt's blocks fit beside the reserve kept for running sequences'
//! growth: admitted prompts then never need a block mid-prefill, so
//! admitting never forces a preemption later.

crate::decision::reasons! {
    /// Why a waiting sequence was or was not admitted in a step.
    #[derive(PartialOrd, Ord)]
    pub enum AdmitReason in "seq_admission" {
        /// Admitted.
        Admitted("admitted") => "admit",
        /// `max_num_seqs` sequences are running.
        MaxNumSeqs("max_num_seqs") => "wait",
        /// Its blocks plus the reserve for running sequences' growth are not
        /// free, even after reclaiming caches.
        KvWatermark("kv_watermark") => "wait",
        /// `max_num_partial_prefills` sequences are mid-prefill.
        PartialPrefills("partial_prefills") => "wait",
        /// It is long and `max_long_partial_prefills` long ones are mid-prefill
        /// (shorter prompts behind it may go first).
        LongPartialPrefills("long_partial_prefills") => "wait",
        /// The step's token budget is spent.
        TokenBudget("token_budget") => "wait",
    }
}

impl AdmitReason {
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
/// the reserve (module doc). The limits are judged in this order.
pub fn decide_seq_admission(i: &AdmitInputs) -> AdmitReason {
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

impl AdmitReason {
    /// As a decision (admit or wait) with the inputs' terms.
    pub fn decision(self, i: &AdmitInputs) -> crate::decision::Decision<AdmitReason> {
        use crate::decision::Reason;
        crate::decision::Decision::new(self.outcomes()[0], self)
            .term("running", i.running as f64)
            .term("need_blocks", i.need_blocks as f64)
            .term("free_blocks", i.free_blocks as f64)
            .term("reserve_blocks", i.reserve_blocks as f64)
            .term("budget_left", i.budget_left as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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
        assert_eq!(decide_seq_admission(&inputs()), AdmitReason::Admitted);
        assert_eq!(decide_seq_admission(&AdmitInputs { running: 4, ..inputs() }), AdmitReason::MaxNumSeqs);
        assert_eq!(decide_seq_admission(&AdmitInputs { partial_prefills: 2, ..inputs() }), AdmitReason::PartialPrefills);
        let long = AdmitInputs { is_long: true, long_partial_prefills: 1, ..inputs() };
        assert_eq!(decide_seq_admission(&long), AdmitReason::LongPartialPrefills);
        assert_eq!(decide_seq_admission(&AdmitInputs { is_long: false, ..long }), AdmitReason::Admitted);
        assert_eq!(decide_seq_admission(&AdmitInputs { budget_left: 0, ..inputs() }), AdmitReason::TokenBudget);
        assert_eq!(decide_seq_admission(&AdmitInputs { free_blocks: 11, ..inputs() }), AdmitReason::KvWatermark);
    }

    #[test]
    fn the_first_limit_in_order_names_the_reason() {
        // Every limit hit at once: the sequence-slot limit is reported.
        let all = AdmitInputs {
            running: 4,
            partial_prefills: 2,
            is_long: true,
            long_partial_prefills: 1,
            budget_left: 0,
            free_blocks: 0,
            ..inputs()
        };
        assert_eq!(decide_seq_admission(&all), AdmitReason::MaxNumSeqs);
        assert_eq!(decide_seq_admission(&AdmitInputs { running: 0, ..all }), AdmitReason::PartialPrefills);
        assert_eq!(decide_seq_admission(&AdmitInputs { running: 0, partial_prefills: 0, ..all }), AdmitReason::LongPartialPrefills);
        let no_long = AdmitInputs { running: 0, partial_prefills: 0, is_long: false, ..all };
        assert_eq!(decide_seq_admission(&no_long), AdmitReason::TokenBudget);
        assert_eq!(decide_seq_admission(&AdmitInputs { budget_left: 1, ..no_long }), AdmitReason::KvWatermark);
    }

    /// Every reason is reached over a grid of inputs, and the labels are
    /// today's.
    #[test]
    fn every_reason_is_reachable_with_todays_labels() {
        let mut seen = HashSet::new();
        for running in [0, 4] {
            for partial in [0, 2] {
                for (is_long, long_partial) in [(false, 0), (true, 0), (true, 1)] {
                    for budget_left in [0, 100] {
                        for free_blocks in [0, 12] {
                            let i = AdmitInputs {
                                running,
                                partial_prefills: partial,
                                is_long,
                                long_partial_prefills: long_partial,
                                budget_left,
                                free_blocks,
                                ..inputs()
                            };
                            seen.insert(decide_seq_admission(&i));
                        }
                    }
                }
            }
        }
        assert_eq!(seen, HashSet::from(AdmitReason::ALL));
        let labels: Vec<_> = AdmitReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["admitted", "max_num_seqs", "kv_watermark", "partial_prefills", "long_partial_prefills", "token_budget"]);
    }

    #[test]
    fn capacity_reasons_wait_for_admission_the_others_behind_prefills() {
        let waits: Vec<_> = AdmitReason::ALL.iter().map(|r| r.wait()).collect();
        use Wait::{Admission as A, Prefill as P};
        assert_eq!(waits, [P, A, A, P, P, P]);
    }
}
