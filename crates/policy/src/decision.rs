//! What every decision has in common: a typed reason ([`Reason`]: a closed
//! enum with labels, declared with [`reasons!`]), the [`Decision`] a caller
//! logs (what was decided, why, and the terms it was judged on), and the
//! label sets ([`LabelSet`]) a reason has in
//! `kvc_decisions_total{decision,outcome,reason}`. The family itself (every
//! decision's label sets, the counts, `log_decision`) is
//! [`crate::decisions_total`], which knows every decision; this file knows
//! none, so each decision's file depends on it alone.
//!
//! The decision functions stay pure: they return what they decided. The
//! caller acts on it and hands it to `log_decision`.

use std::fmt::Debug;

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
/// `in`, the [`Reason`] impl. Four forms:
///
/// - `enum R in "decision" { V("label") => "outcome" | "other", ... }`;
/// - `enum R in "decision" { V("label"), ... } outcomes = |r| expr`, where
///   the outcomes follow from another method of the enum;
/// - `enum R in "decision" { V("label"), ... } outcome: O = |r| expr`, where
///   each reason has one outcome, a value of the labels-alone enum `O`: the
///   outcomes are its label, and `R::pairs()` lists every (outcome, reason)
///   pair (the counter's label sets);
/// - `enum R { V("label"), ... }`: labels alone (a decision's outcome, or a
///   part of a reason).
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $decision:literal {
            $( $(#[$vmeta:meta])* $variant:ident($label:literal) ),+ $(,)?
        }
        outcome: $outcome:ty = |$r:ident| $of:expr
    ) => {
        $crate::decision::reasons! {
            $(#[$meta])*
            $vis enum $name in $decision {
                $( $(#[$vmeta])* $variant($label) ),+
            }
            outcomes = |$r| $of.as_outcomes()
        }

        impl $name {
            /// Every (outcome, reason) pair a decision can be: the counter's label sets.
            pub fn pairs() -> impl Iterator<Item = ($outcome, $name)> {
                $name::ALL.into_iter().map(|$r| ($of, $r))
            }
        }
    };
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

pub(crate) fn sets_of<R: Reason>(out: &mut Vec<LabelSet>) {
    for &r in R::ALL {
        for &outcome in r.outcomes() {
            out.push(LabelSet { decision: R::DECISION, outcome, reason: r.label() });
        }
    }
}

/// Every label set of `R`, in order.
pub fn label_sets_of<R: Reason>() -> Vec<LabelSet> {
    let mut out = Vec::new();
    sets_of::<R>(&mut out);
    out
}
