//! The admission probe (`POST /admission`): can this engine take a turn
//! now? By [`decide_admission_probe`], over the engine's published
//! snapshot (the engine gathers the view; it never enters the step loop).
//! Not the scheduler's per-step admission ([`crate::seq_admission`]).
//! Counted as `kvc_decisions_total{decision="admission_probe"}`, every
//! reason of [`AdmissionProbeReason::ALL`] exported at 0.

use crate::decision::{Decision, Reason};

crate::decision::reasons! {
    /// Why the probe answers as it does: the `reason` field of its answer.
    pub enum AdmissionProbeReason in "admission_probe" {
        /// It can be admitted now.
        Ok("ok"),
        /// The prompt does not fit the context (`max_model_len`): never.
        PromptTooLong("prompt_too_long"),
        /// The blocks for the tokens to compute are neither free nor reclaimable.
        KvPoolFull("kv_pool_full"),
        /// As many requests wait as the batch holds.
        QueueFull("queue_full"),
    }
    outcomes = |r| crate::decision::admit_or_refuse(r.admits())
}

impl AdmissionProbeReason {
    pub fn admits(self) -> bool {
        self == AdmissionProbeReason::Ok
    }
}

/// What the probe is judged on: the query and the engine's snapshot.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionProbeInputs {
    pub prompt_tokens: usize,
    /// Tokens of the session's KV the engine holds (any tier; 0: none).
    pub resident_tokens: usize,
    pub block_size: usize,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub free_blocks: usize,
    pub evictable_blocks: usize,
    pub waiting: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionProbeDecision {
    pub reason: AdmissionProbeReason,
    /// Prompt tokens the engine expects to compute (the rest is reused).
    pub computed_tokens: usize,
    /// How long to wait before trying again (0 when admitted or never).
    pub recommended_pause_ms: u64,
}

impl AdmissionProbeDecision {
    pub fn decision(&self) -> Decision<AdmissionProbeReason> {
        Decision::new(self.reason.outcomes()[0], self.reason)
            .term("computed_tokens", self.computed_tokens as f64)
            .term("recommended_pause_ms", self.recommended_pause_ms as f64)
    }
}

/// One explicit rule: the prompt must fit the context; the blocks for the
/// tokens to compute must be free or reclaimable; the queue must be shorter
/// than the batch. Reuse is estimated as the session's resident tokens
/// (whole blocks, [`crate::reusable_tokens`]), which assumes the new
/// prompt extends the last turn.
pub fn decide_admission_probe(i: &AdmissionProbeInputs) -> AdmissionProbeDecision {
    let reusable = crate::reusable_tokens(i.resident_tokens, i.prompt_tokens, i.block_size);
    let computed = i.prompt_tokens - reusable;
    let need_blocks = computed.div_ceil(i.block_size.max(1)) + 1;
    let available = i.free_blocks + i.evictable_blocks;
    let reason = if i.prompt_tokens >= i.max_model_len {
        AdmissionProbeReason::PromptTooLong
    } else if need_blocks > available {
        AdmissionProbeReason::KvPoolFull
    } else if i.waiting >= i.max_num_seqs {
        AdmissionProbeReason::QueueFull
    } else {
        AdmissionProbeReason::Ok
    };
    let recommended_pause_ms = match reason {
        AdmissionProbeReason::Ok | AdmissionProbeReason::PromptTooLong => 0,
        AdmissionProbeReason::KvPoolFull | AdmissionProbeReason::QueueFull => (50 * (i.waiting as u64 + 1)).min(5000),
    };
    AdmissionProbeDecision { reason, computed_tokens: computed, recommended_pause_ms }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn inputs() -> AdmissionProbeInputs {
        AdmissionProbeInputs {
            prompt_tokens: 64,
            resident_tokens: 0,
            block_size: 16,
            max_model_len: 1000,
            max_num_seqs: 8,
            free_blocks: 100,
            evictable_blocks: 0,
            waiting: 0,
        }
    }

    #[test]
    fn resident_tokens_spare_blocks_and_each_limit_has_its_reason() {
        let warm = AdmissionProbeInputs { prompt_tokens: 120, resident_tokens: 100, free_blocks: 3, ..inputs() };
        let d = decide_admission_probe(&warm);
        assert_eq!((d.reason, d.computed_tokens, d.recommended_pause_ms), (AdmissionProbeReason::Ok, 24, 0));
        let cold = decide_admission_probe(&AdmissionProbeInputs { resident_tokens: 0, ..warm });
        assert_eq!(cold.reason, AdmissionProbeReason::KvPoolFull);
        assert!(cold.recommended_pause_ms > 0);
        let reclaim = AdmissionProbeInputs { free_blocks: 0, evictable_blocks: 10, ..inputs() };
        assert_eq!(decide_admission_probe(&reclaim).reason, AdmissionProbeReason::Ok);
        assert_eq!(decide_admission_probe(&AdmissionProbeInputs { waiting: 8, ..inputs() }).reason, AdmissionProbeReason::QueueFull);
        let long = AdmissionProbeInputs { prompt_tokens: 1000, ..inputs() };
        assert_eq!(decide_admission_probe(&long).reason, AdmissionProbeReason::PromptTooLong);
        assert_eq!(decide_admission_probe(&long).recommended_pause_ms, 0);
    }

    #[test]
    fn every_reason_is_reachable_with_todays_labels() {
        let mut seen = HashSet::new();
        for prompt_tokens in [64, 1000] {
            for free_blocks in [0, 100] {
                for waiting in [0, 8] {
                    let d = decide_admission_probe(&AdmissionProbeInputs { prompt_tokens, free_blocks, waiting, ..inputs() });
                    assert_eq!(d.decision().outcome, if d.reason.admits() { "admit" } else { "refuse" });
                    seen.insert(d.reason);
                }
            }
        }
        assert_eq!(seen, HashSet::from(AdmissionProbeReason::ALL));
        let labels: Vec<_> = AdmissionProbeReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["ok", "prompt_too_long", "kv_pool_full", "queue_full"]);
    }
}
