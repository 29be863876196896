//! What every decision has in common: a typed reason ([`Reason`]: a closed
//! enum with labels), the [`Decision`] a caller logs (what was decided,
//! why, and the terms it was judged on), [`log_decision`], and the one
//! counter family behind it, `kvc_decisions_total{decision,outcome,reason}`,
//! whose label sets ([`label_sets`]) are closed, so a server exports every
//! one at 0 from the start ([`counts`]).
//!
//! The decision functions stay pure: they return what they decided. The
//! caller acts on it and hands it to [`log_decision`], which counts it in a
//! process-wide table (one atomic per label set: a process is one server
//! of one role) and writes one `event="decision"` debug line through
//! `tracing` (the logging facade only: no subscriber, no I/O here).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A decision's reason: a closed enum, every value with a label and the
/// outcomes a decision with it can have.
pub trait Reason: Copy + Debug + PartialEq + 'static {
    /// The decision's name: the `decision` label (`step_kind`, ...).
    const DECISION: &'static str;
    /// Every reason, in label order.
    const ALL: &'static [Self];
    /// The `reason` label (and log field).
    fn label(self) -> &'static str;
    /// The `outcome` labels a decision with this reason can have (what it
    /// decided: `mixed`, `wait`, `remote_prefill`, ...).
    fn outcomes(self) -> &'static [&'static str];
}

/// Declares a reason enum from one listing: every variant with its doc
/// comment, its label and, for a decision's reason, the outcomes a decision
/// with it can have. It generates the enum (`Debug, Clone, Copy, PartialEq,
/// Eq, Hash`; more derives may be added above it), `ALL` (every variant, in
/// listing order), `as_str` (the label) and, with a decision's name after
/// `in`, the [`Reason`] impl. Three forms:
///
/// - `enum R in "decision" { V("label") => "outcome" | "other", ... }`;
/// - `enum R in "decision" { V("label"), ... } outcomes = |r| expr`, where
///   the outcomes follow from another method of the enum;
/// - `enum R { V("label"), ... }`: labels alone (a decision's outcome, or a
///   part of a reason).
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $decision:literal {
            $( $(#[$vmeta:meta])* $variant:ident($label:literal) => $($outcome:literal)|+ ),+ $(,)?
        }
    ) => {
        $crate::decision::reasons! {
            $(#[$meta])*
            $vis enum $name in $decision {
                $( $(#[$vmeta])* $variant($label) ),+
            }
            outcomes = |r| match r {
                $( $name::$variant => &[$($outcome),+], )+
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $decision:literal {
            $( $(#[$vmeta:meta])* $variant:ident($label:literal) ),+ $(,)?
        }
        outcomes = |$r:ident| $outcomes:expr
    ) => {
        $crate::decision::reasons! {
            $(#[$meta])*
            $vis enum $name {
                $( $(#[$vmeta])* $variant($label) ),+
            }
        }

        impl $crate::decision::Reason for $name {
            const DECISION: &'static str = $decision;
            const ALL: &'static [Self] = &Self::ALL;
            fn label(self) -> &'static str {
                self.as_str()
            }
            fn outcomes(self) -> &'static [&'static str] {
                let $r = self;
                $outcomes
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident($label:literal) ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in listing order.
            pub const ALL: [$name; [$($label),+].len()] = [$($name::$variant),+];

            /// The label (and log field).
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $label, )+
                }
            }

            /// The label alone, as a decision's outcomes.
            pub fn as_outcomes(self) -> &'static [&'static str] {
                match self {
                    $( $name::$variant => &[$label], )+
                }
            }
        }
    };
}
pub(crate) use reasons;

/// One decision: what it decided (`outcome`), why, and the terms it was
/// judged on (for the log line).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<R> {
    pub outcome: &'static str,
    pub reason: R,
    terms: Vec<(&'static str, f64)>,
}

impl<R: Reason> Decision<R> {
    pub fn new(outcome: &'static str, reason: R) -> Self {
        debug_assert!(reason.outcomes().contains(&outcome), "{} {outcome:?} is not an outcome of {reason:?}", R::DECISION);
        Self { outcome, reason, terms: Vec::new() }
    }

    /// With one more term.
    pub fn term(mut self, name: &'static str, value: f64) -> Self {
        self.terms.push((name, value));
        self
    }

    /// The terms it was judged on, in order.
    pub fn terms(&self) -> &[(&'static str, f64)] {
        &self.terms
    }

    /// `name=value ...` of the terms.
    pub fn terms_text(&self) -> String {
        self.terms.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }
}

/// The outcome of a decision that takes a request or refuses it.
pub fn admit_or_refuse(admits: bool) -> &'static [&'static str] {
    if admits {
        &["admit"]
    } else {
        &["refuse"]
    }
}

/// One label set of `kvc_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelSet {
    pub decision: &'static str,
    pub outcome: &'static str,
    pub reason: &'static str,
}

/// The decisions the router takes (a worker takes every other one).
pub const ROUTER_DECISIONS: &[&str] = &[crate::route_score::RouteReason::DECISION];

fn sets_of<R: Reason>(out: &mut Vec<LabelSet>) {
    for &r in R::ALL {
        for &outcome in r.outcomes() {
            out.push(LabelSet { decision: R::DECISION, outcome, reason: r.label() });
        }
    }
}

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

/// Every label set of `R`, in order.
pub fn label_sets_of<R: Reason>() -> Vec<LabelSet> {
    let mut out = Vec::new();
    sets_of::<R>(&mut out);
    out
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
        ] {
            assert!(decisions.contains(d), "{d}");
        }
        assert!(ROUTER_DECISIONS.iter().all(|d| decisions.contains(d)));
    }

    #[test]
    fn a_logged_decision_is_counted_under_its_label_set() {
        use crate::step_kind::StepKindReason;
        let key = LabelSet { decision: "step_kind", outcome: "decode_only", reason: "interleave" };
        let before = counts().into_iter().find(|(s, _)| *s == key).expect("label set").1;
        let d = Decision::new("decode_only", StepKindReason::Interleave).term("last_mixed_s", 0.1);
        assert_eq!(d.terms_text(), "last_mixed_s=0.1");
        log_decision(&d);
        let after = counts().into_iter().find(|(s, _)| *s == key).expect("label set").1;
        assert!(after > before);
    }
}
