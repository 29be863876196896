//! The one counter family of decisions,
//! `kvc_decisions_total{decision,outcome,reason}`: every decision's label
//! sets ([`label_sets`], closed, so a server exports every one at 0 from
//! the start), counted in a process-wide table (one atomic per label set:
//! a process is one server of one role) by [`log_decision`], which also
//! writes one `event="decision"` debug line through `tracing` (the logging
//! facade only: no subscriber, no I/O here). A new decision is listed in
//! [`table`] once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::decision::{sets_of, Decision, LabelSet, Reason};

/// The decisions the router takes (a worker takes every other one).
pub const ROUTER_DECISIONS: &[&str] = &[crate::route_score::RouteReason::DECISION];

/// Every label set of every decision, by decision then reason: closed, so
/// a server exports them all at 0.
pub fn label_sets() -> &'static [LabelSet] {
    &table().0
}

type Table = (Vec<LabelSet>, HashMap<LabelSet, usize>, Vec<AtomicU64>);

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut sets = Vec::new();
        sets_of::<crate::seq_admission::AdmitReason>(&mut sets);
        sets_of::<crate::preemption::PreemptionReason>(&mut sets);
        sets_of::<crate::admission_probe::AdmissionProbeReason>(&mut sets);
        sets_of::<crate::eviction::EvictionReason>(&mut sets);
        sets_of::<crate::write_back::WriteBackReason>(&mut sets);
        sets_of::<crate::spill::SpillReason>(&mut sets);
        sets_of::<crate::host_drop::HostDropReason>(&mut sets);
        sets_of::<crate::session_cap::SessionCapReason>(&mut sets);
        sets_of::<crate::prefill_path::PathReason>(&mut sets);
        sets_of::<crate::prefill_fallback::FallbackReason>(&mut sets);
        sets_of::<crate::prefill_peer::PeerReason>(&mut sets);
        sets_of::<crate::route_score::RouteReason>(&mut sets);
        sets_of::<crate::snapshot_push::SnapshotPushReason>(&mut sets);
        sets_of::<crate::step_kind::StepKindReason>(&mut sets);
        sets_of::<crate::queue_delay::QueueDelayReason>(&mut sets);
        sets_of::<crate::step_budget::StepBudgetReason>(&mut sets);
        sets_of::<crate::kernel_plan::KernelPlanReason>(&mut sets);
        sets_of::<crate::reuse::ReuseReason>(&mut sets);
        sets_of::<crate::fp8_attention::Fp8AttentionReason>(&mut sets);
        let index = sets.iter().enumerate().map(|(i, s)| (*s, i)).collect();
        let counts = sets.iter().map(|_| AtomicU64::new(0)).collect();
        (sets, index, counts)
    })
}

/// Counts `d` in `kvc_decisions_total` (without a log line).
pub fn count<R: Reason>(d: &Decision<R>) {
    let (_, index, counts) = table();
    let key = LabelSet { decision: R::DECISION, outcome: d.outcome, reason: d.reason.label() };
    if let Some(&i) = index.get(&key) {
        counts[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts `d` and logs it: `event="decision"` with its decision, outcome,
/// reason and terms, at debug level (some decisions are taken every step).
pub fn log_decision<R: Reason>(d: &Decision<R>) {
    count(d);
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!(
            event = "decision",
            decision = R::DECISION,
            outcome = d.outcome,
            reason = d.reason.label(),
            terms = %d.terms_text()
        );
    }
}

/// Every label set with its count in this process, in [`label_sets`]'s
/// order.
pub fn counts() -> Vec<(LabelSet, u64)> {
    let (sets, _, counts) = table();
    sets.iter().zip(counts).map(|(s, n)| (*s, n.load(Ordering::Relaxed))).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn label_sets_are_unique_and_snake_case() {
        let sets = label_sets();
        let unique: HashSet<_> = sets.iter().collect();
        assert_eq!(unique.len(), sets.len());
        let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        for s in sets {
            assert!(ok(s.decision) && ok(s.outcome) && ok(s.reason), "{s:?}");
        }
        let decisions: HashSet<_> = sets.iter().map(|s| s.decision).collect();
        for d in [
            "seq_admission",
            "preemption",
            "admission_probe",
            "eviction",
            "write_back",
            "spill",
            "host_drop",
            "session_cap",
            "prefill_path",
            "prefill_fallback",
            "prefill_peer",
            "route_score",
            "snapshot_push",
            "step_kind",
            "queue_delay",
            "step_budget",
            "kernel_plan",
            "kv_reuse",
            "fp8_attention",
        ] {
            assert!(decisions.contains(d), "{d}");
        }
        assert!(ROUTER_DECISIONS.iter().all(|d| decisions.contains(d)));
    }

    #[test]
    fn a_logged_decision_is_counted_under_its_label_set() {
        use crate::step_kind::StepKindReason;
        use crate::Decision;
        let key = LabelSet { decision: "step_kind", outcome: "decode_only", reason: "interleave" };
        let before = counts().into_iter().find(|(s, _)| *s == key).expect("label set").1;
        let d = Decision::new("decode_only", StepKindReason::Interleave).term("last_mixed_s", 0.1);
        assert_eq!(d.terms_text(), "last_mixed_s=0.1");
        log_decision(&d);
        let after = counts().into_iter().find(|(s, _)| *s == key).expect("label set").1;
        assert!(after > before);
    }
}
