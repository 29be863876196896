//! How a request's prompt was served: where it was computed and why (the
//! `kvc` body field and `x-kvc-path`), as a backend reports it
//! ([`crate::backend::Started`]) and a decode worker decides it
//! ([`crate::pd::decode`]).

use kvc_disagg::prefill_path::{FallbackReason, PathReason};
use kvc_engine::ServePath;

/// How a request's prompt was served (the `kvc` body field and
/// `x-kvc-path`); the default (no reason) says nothing beyond the
/// engine's own usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Route {
    pub path: ServePath,
    pub reason: Option<RouteReason>,
    /// Prompt tokens computed by a prefill worker (remote paths).
    pub remote_computed_tokens: Option<usize>,
    pub transferred_tokens: usize,
}

/// Why a decode worker served a prompt where it did: the typed reason of
/// the decision behind it, whose label is the `kvc.reason` body field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteReason {
    /// The prefill-path decision's reason.
    Path(PathReason),
    /// A remote prefill failed and the prompt was computed here (the
    /// `prefill_fallback` decision's reason).
    Fallback(FallbackReason),
}

impl RouteReason {
    /// The `kvc.reason` label: the path decision's reason label, or
    /// `fallback_` and the fallback's.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::Path(r) => r.as_str(),
            RouteReason::Fallback(FallbackReason::RemotePrefillFailed) => "fallback_remote_prefill_failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_route_reason_is_labelled_by_its_decisions_reason_and_no_two_share_a_label() {
        let mut labels = HashSet::new();
        for r in PathReason::ALL {
            assert_eq!(RouteReason::Path(r).as_str(), r.as_str());
            assert!(labels.insert(RouteReason::Path(r).as_str()));
        }
        for r in FallbackReason::ALL {
            assert_eq!(RouteReason::Fallback(r).as_str(), format!("fallback_{}", r.as_str()));
            assert!(labels.insert(RouteReason::Fallback(r).as_str()));
        }
    }
}
