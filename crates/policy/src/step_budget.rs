//! Whether the engine gives the next step a time budget for its prefill
//! chunks (`--max-step-ms`), by [`decide_step_budget`]: only with a target
//! and a fit of the step-time model that has seen prefill and prices it.
//! Without one only `--max-num-batched-tokens` limits the step, and the
//! reason says why.

/// Steps with prefill the step-time model must have seen before its fit is
/// trusted.
pub const MIN_PREFILL_SAMPLES: usize = 2;

/// What the step-time model knows before a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepBudgetInputs {
    /// The step-time target, seconds (None: `--max-step-ms` is off).
    pub target_s: Option<f64>,
    /// Steps with prefill the fit has seen.
    pub prefill_samples: usize,
    /// The fit's seconds per prefill token, and per prefill token and
    /// token of its context (either may be exactly 0).
    pub per_token_s: f64,
    pub per_context_token_s: f64,
}

crate::decision::reasons! {
    /// Why [`decide_step_budget`] decided as it did.
    pub enum StepBudgetReason in "step_budget" {
        /// A budget: the target less the step's fixed part.
        Budgeted("budgeted") => "budget",
        /// No step-time target is set.
        NoTarget("no_target") => "no_budget",
        /// The fit has seen fewer than [`MIN_PREFILL_SAMPLES`] steps with prefill.
        Unmeasured("unmeasured") => "no_budget",
        /// The fit prices a prefill token at nothing, linearly and through its
        /// attention alike (the non-negative fit may put either at exactly 0).
        NoPrefillCost("no_prefill_cost") => "no_budget",
    }
}

impl StepBudgetReason {
    /// The decision to log and count.
    pub fn decision(self) -> crate::decision::Decision<StepBudgetReason> {
        use crate::decision::Reason;
        crate::decision::Decision::new(self.outcomes()[0], self)
    }
}

/// Whether the next step gets a time budget, and why not when it does not.
pub fn decide_step_budget(i: &StepBudgetInputs) -> StepBudgetReason {
    if i.target_s.is_none() {
        StepBudgetReason::NoTarget
    } else if i.prefill_samples < MIN_PREFILL_SAMPLES {
        StepBudgetReason::Unmeasured
    } else if i.per_token_s <= 0.0 && i.per_context_token_s <= 0.0 {
        StepBudgetReason::NoPrefillCost
    } else {
        StepBudgetReason::Budgeted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn measured() -> StepBudgetInputs {
        StepBudgetInputs { target_s: Some(0.1), prefill_samples: 10, per_token_s: 3e-5, per_context_token_s: 1e-9 }
    }

    #[test]
    fn each_condition_withholds_the_budget() {
        assert_eq!(decide_step_budget(&measured()), StepBudgetReason::Budgeted);
        let cases: [(fn(&mut StepBudgetInputs), StepBudgetReason); 3] = [
            (|i| i.target_s = None, StepBudgetReason::NoTarget),
            (|i| i.prefill_samples = MIN_PREFILL_SAMPLES - 1, StepBudgetReason::Unmeasured),
            (
                |i| {
                    i.per_token_s = 0.0;
                    i.per_context_token_s = 0.0
                },
                StepBudgetReason::NoPrefillCost,
            ),
        ];
        for (change, want) in cases {
            let mut i = measured();
            change(&mut i);
            assert_eq!(decide_step_budget(&i), want);
        }
        // Attention alone prices a token.
        let i = StepBudgetInputs { per_token_s: 0.0, ..measured() };
        assert_eq!(decide_step_budget(&i), StepBudgetReason::Budgeted);
    }

    #[test]
    fn labels_are_distinct_and_cover_every_reason() {
        let labels: HashSet<&str> = StepBudgetReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), StepBudgetReason::ALL.len());
    }
}
