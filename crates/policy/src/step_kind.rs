//! Whether the next engine step carries prefill chunks beside its decodes
//! (a mixed step) or runs the decodes alone (a decode-only step), by
//! [`decide_step_kind`]. Counted as
//! `kvc_decisions_total{decision="step_kind"}` (the kind its outcome), every pair of
//! [`StepKindReason::pairs`] exported at 0.
//!
//! A mixed step pays the model's weights and the decodes once and fills
//! the rest of `--max-step-ms` with prefill; every decode in it waits the
//! whole step for its token. Shorter mixed steps would cut that wait, but
//! each still pays the fixed part (on a mixture of experts, reading every
//! expert), so prefill throughput falls fast. Decode-only steps between
//! long mixed steps cut the gap for most tokens at a smaller price: with
//! `k` of them after each mixed step, `k` of every `k + 1` tokens come
//! after a decode-only step. Two per mixed step make the median gap a
//! decode-only step's.
//!
//! They are taken only while prefill has slack: the prompt tokens waiting
//! (queued and mid-prefill) would be computed within [`BACKLOG_SLACK_S`] at
//! the measured rate beside decodes. A backlog beyond that gets every
//! step's prefill, as without a target, so interleaving gives back
//! throughput exactly when there is prefill to spare and costs none when
//! the queue grows.

/// Decode-only steps after each mixed step that went over the target.
pub const DECODE_ONLY_PER_MIXED: usize = 2;

/// Default seconds of waiting prefill (at the measured rate beside
/// decodes) up to which decode-only steps are interleaved
/// ([`StepKindInputs::backlog_slack_s`]): a prompt arriving then waits
/// about this long for its first token, stretched by the decode-only steps
/// (a third at [`DECODE_ONLY_PER_MIXED`] = 2 beside 100 ms mixed steps).
pub const BACKLOG_SLACK_S: f64 = 0.5;

/// What the engine knows before it plans a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepKindInputs {
    /// The target gap between a decode's tokens, seconds (None: off).
    pub itl_target_s: Option<f64>,
    /// Sequences that decode in the next step.
    pub decodes: usize,
    /// Prompt tokens still to compute, running and waiting.
    pub prefill_tokens: usize,
    /// Prompt tokens per second a step computes beside decodes (0: not
    /// measured yet).
    pub prefill_tokens_per_s: f64,
    /// Seconds the last mixed step took (None: none yet).
    pub last_mixed_s: Option<f64>,
    /// Predicted seconds of a decode-only step of these decodes.
    pub decode_only_s: f64,
    /// Decode-only steps taken since the last mixed step.
    pub decode_only_since_mixed: usize,
    /// Seconds of waiting prefill up to which decode-only steps are taken
    /// ([`BACKLOG_SLACK_S`] by default).
    pub backlog_slack_s: f64,
}

crate::decision::reasons! {
    /// What the next step carries: the `outcome` label.
    pub enum StepKind {
        /// Decodes and prefill chunks (either may be absent).
        Mixed("mixed"),
        /// Decodes alone, though prefill waits.
        DecodeOnly("decode_only"),
    }
}

crate::decision::reasons! {
    /// Why [`decide_step_kind`] decided as it did.
    pub enum StepKindReason in "step_kind" {
        /// No ITL target is set.
        NoTarget("no_target"),
        /// Nothing decodes: prefill takes the step.
        NoDecodes("no_decodes"),
        /// No prompt tokens wait: the step is decodes only anyway.
        NoPrefill("no_prefill"),
        /// The last mixed step met the target (or none ran yet): decodes lose
        /// nothing to the next one.
        MixedWithinTarget("mixed_within_target"),
        /// A decode-only step would not meet the target either.
        DecodeOnlyOverTarget("decode_only_over_target"),
        /// The waiting prefill exceeds the backlog slack (or its rate is not
        /// measured yet).
        Backlog("backlog"),
        /// [`DECODE_ONLY_PER_MIXED`] decode-only steps ran since the last mixed one.
        Interleaved("interleaved"),
        /// The last mixed step went over the target and prefill has slack.
        Interleave("interleave"),
    }
    outcome: StepKind = |r| r.kind()
}

impl StepKindReason {
    /// The kind a decision with this reason takes.
    pub fn kind(self) -> StepKind {
        match self {
            StepKindReason::Interleave => StepKind::DecodeOnly,
            _ => StepKind::Mixed,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepKindDecision {
    pub kind: StepKind,
    pub reason: StepKindReason,
}

/// Mixed unless the last mixed step went over the ITL target, a
/// decode-only step meets it, fewer than [`DECODE_ONLY_PER_MIXED`]
/// decode-only steps ran since, and the waiting prefill fits in the
/// backlog slack at the measured rate (module doc).
pub fn decide_step_kind(i: &StepKindInputs) -> StepKindDecision {
    let reason = match i.itl_target_s {
        None => StepKindReason::NoTarget,
        Some(_) if i.decodes == 0 => StepKindReason::NoDecodes,
        Some(_) if i.prefill_tokens == 0 => StepKindReason::NoPrefill,
        Some(t) if i.last_mixed_s.is_none_or(|s| s <= t) => StepKindReason::MixedWithinTarget,
        Some(t) if i.decode_only_s > t => StepKindReason::DecodeOnlyOverTarget,
        Some(_) if i.decode_only_since_mixed >= DECODE_ONLY_PER_MIXED => StepKindReason::Interleaved,
        Some(_) if !(i.prefill_tokens_per_s > 0.0 && i.prefill_tokens as f64 / i.prefill_tokens_per_s <= i.backlog_slack_s) => {
            StepKindReason::Backlog
        }
        Some(_) => StepKindReason::Interleave,
    };
    StepKindDecision { kind: reason.kind(), reason }
}

impl StepKindDecision {
    /// As a decision, with the terms it was judged on.
    pub fn decision(&self, i: &StepKindInputs) -> crate::decision::Decision<StepKindReason> {
        crate::decision::Decision::new(self.kind.as_str(), self.reason)
            .term("itl_target_s", i.itl_target_s.unwrap_or(0.0))
            .term("decodes", i.decodes as f64)
            .term("prefill_tokens", i.prefill_tokens as f64)
            .term("last_mixed_s", i.last_mixed_s.unwrap_or(0.0))
            .term("decode_only_s", i.decode_only_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A GPU's numbers: 100 ms mixed steps, 18 ms decode-only ones, 20K
    /// prompt tokens/s beside decodes, 40 ms target, 5K tokens waiting.
    fn gpu() -> StepKindInputs {
        StepKindInputs {
            itl_target_s: Some(0.04),
            decodes: 32,
            prefill_tokens: 5_000,
            prefill_tokens_per_s: 20_000.0,
            last_mixed_s: Some(0.1),
            decode_only_s: 0.018,
            decode_only_since_mixed: 0,
            backlog_slack_s: BACKLOG_SLACK_S,
        }
    }

    #[test]
    fn two_decode_only_steps_follow_a_long_mixed_step_while_prefill_has_slack() {
        let mut i = gpu();
        let mut kinds = Vec::new();
        for _ in 0..9 {
            let d = decide_step_kind(&i);
            kinds.push(d.kind);
            match d.kind {
                StepKind::DecodeOnly => i.decode_only_since_mixed += 1,
                StepKind::Mixed => i.decode_only_since_mixed = 0,
            }
        }
        use StepKind::{DecodeOnly as D, Mixed as M};
        assert_eq!(kinds, [D, D, M, D, D, M, D, D, M]);
    }

    #[test]
    fn each_condition_keeps_the_step_mixed() {
        let cases: [(fn(&mut StepKindInputs), StepKindReason); 8] = [
            (|i| i.itl_target_s = None, StepKindReason::NoTarget),
            (|i| i.decodes = 0, StepKindReason::NoDecodes),
            (|i| i.prefill_tokens = 0, StepKindReason::NoPrefill),
            (|i| i.last_mixed_s = Some(0.035), StepKindReason::MixedWithinTarget),
            (|i| i.last_mixed_s = None, StepKindReason::MixedWithinTarget),
            (|i| i.decode_only_s = 0.05, StepKindReason::DecodeOnlyOverTarget),
            // 0.5 s of backlog is the edge; 12K tokens at 20K/s are 0.6 s.
            (|i| i.prefill_tokens = 12_000, StepKindReason::Backlog),
            (|i| i.prefill_tokens_per_s = 0.0, StepKindReason::Backlog),
        ];
        for (change, want) in cases {
            let mut i = gpu();
            change(&mut i);
            let d = decide_step_kind(&i);
            assert_eq!((d.kind, d.reason), (StepKind::Mixed, want), "{i:?}");
        }
        let mut edge = gpu();
        edge.prefill_tokens = 10_000;
        assert_eq!(decide_step_kind(&edge).reason, StepKindReason::Interleave);
    }

    /// Every decision over a grid of inputs is one of the counter's pairs,
    /// and every pair is reached.
    #[test]
    fn decisions_stay_in_the_table_and_reach_every_pair() {
        let table: HashSet<_> = StepKindReason::pairs().collect();
        let mut seen = HashSet::new();
        for target in [None, Some(0.04)] {
            for decodes in [0, 1, 64] {
                for prefill_tokens in [0, 100, 50_000] {
                    for rate in [0.0, 20_000.0] {
                        for last in [None, Some(0.02), Some(0.1)] {
                            for decode_only_s in [0.01, 0.08] {
                                for since in [0, 1, 2, 5] {
                                    let i = StepKindInputs {
                                        itl_target_s: target,
                                        decodes,
                                        prefill_tokens,
                                        prefill_tokens_per_s: rate,
                                        last_mixed_s: last,
                                        decode_only_s,
                                        decode_only_since_mixed: since,
                                        backlog_slack_s: BACKLOG_SLACK_S,
                                    };
                                    let d = decide_step_kind(&i);
                                    assert!(table.contains(&(d.kind, d.reason)), "{d:?}");
                                    seen.insert((d.kind, d.reason));
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen, table);
    }
}
