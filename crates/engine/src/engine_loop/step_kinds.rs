//! The engine's side of the step-kind decision (`kvc_policy::step_kind`):
//! the inputs it gathers before each step, what it remembers between
//! steps (the last mixed step's time, the decode-only steps since), and
//! this engine's own count of the decisions ([`crate::EngineStats`]'s
//! `step_kinds`; `/metrics` counts them in
//! `kvc_decisions_total{decision="step_kind"}`).

use std::collections::HashMap;

use kvc_policy::step_kind::{decide_step_kind, StepKind, StepKindDecision, StepKindInputs, StepKindReason};
use kvc_scheduler::Scheduler;

use crate::step_model::{StepModel, StepShape};

#[derive(Debug, Default)]
pub(super) struct StepKinds {
    /// `--itl-target-ms` in seconds (None: off).
    itl_target_s: Option<f64>,
    backlog_slack_s: f64,
    last_mixed_s: Option<f64>,
    decode_only_since_mixed: usize,
    counts: HashMap<StepKindReason, u64>,
}

impl StepKinds {
    pub(super) fn new(itl_target_ms: Option<f64>, backlog_slack_s: f64) -> Self {
        Self { itl_target_s: itl_target_ms.filter(|ms| *ms > 0.0).map(|ms| ms / 1e3), backlog_slack_s, ..Default::default() }
    }

    /// Decides the next step's kind, logs and counts it.
    pub(super) fn decide(&mut self, scheduler: &Scheduler, model: &StepModel, prefill_tokens_per_s: f64) -> StepKindDecision {
        let (decodes, decode_context) = scheduler.decode_load();
        let inputs = StepKindInputs {
            itl_target_s: self.itl_target_s,
            decodes,
            prefill_tokens: scheduler.pending_prefill_tokens(),
            prefill_tokens_per_s,
            last_mixed_s: self.last_mixed_s,
            decode_only_s: model.predict(&StepShape { decodes, decode_context, prefill: Vec::new() }),
            decode_only_since_mixed: self.decode_only_since_mixed,
            backlog_slack_s: self.backlog_slack_s,
        };
        let d = decide_step_kind(&inputs);
        *self.counts.entry(d.reason).or_default() += 1;
        kvc_policy::log_decision(&d.decision(&inputs));
        if d.kind == StepKind::DecodeOnly {
            tracing::debug!(
                event = "step_kind",
                kind = d.kind.as_str(),
                reason = d.reason.as_str(),
                decodes,
                prefill_tokens = inputs.prefill_tokens,
                last_mixed_ms = inputs.last_mixed_s.unwrap_or(0.0) * 1e3,
            );
        }
        d
    }

    /// Records the step that ran: one with prefill chunks resets the
    /// interleave, a decode-only one counts towards it.
    pub(super) fn observe(&mut self, had_prefill: bool, had_decodes: bool, took_s: f64) {
        if had_prefill {
            // A step with prefill and no decodes delays no decode.
            self.last_mixed_s = had_decodes.then_some(took_s);
            self.decode_only_since_mixed = 0;
        } else if had_decodes {
            self.decode_only_since_mixed += 1;
        }
    }

    /// Every (kind, reason) pair with its count, 0 where none was decided.
    pub(super) fn counts(&self) -> Vec<((&'static str, &'static str), u64)> {
        StepKindReason::pairs().map(|(k, r)| ((k.as_str(), r.as_str()), self.counts.get(&r).copied().unwrap_or(0))).collect()
    }
}
