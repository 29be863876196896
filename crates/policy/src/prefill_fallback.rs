//! Where a decode worker computes a prompt suffix whose remote prefill
//! failed after [`crate::prefill_path::decide`] sent it to a prefill
//! worker, by [`decide_fallback`]: here, into the blocks reserved for the
//! transfer. Counted as `kvc_decisions_total{decision="prefill_fallback"}`.
//! [`crate::prefill_path`] re-exports it.

use crate::decision::Decision;
use crate::prefill_path::PrefillPath;

crate::decision::reasons! {
    /// Why a decode worker computed a prompt itself after choosing a
    /// prefill worker: the `reason` of
    /// `kvc_decisions_total{decision="prefill_fallback"}`.
    pub enum FallbackReason in "prefill_fallback" {
        /// The remote prefill failed (P unreachable, an error, past its budget):
        /// computed here, into the same reserved blocks.
        RemotePrefillFailed("remote_prefill_failed") => "direct_append" | "local",
    }
}

/// Where a suffix whose remote prefill failed is computed: here, into the
/// reservation's blocks, extending them when they are the request's own
/// session.
pub fn decide_fallback(session_hit: bool) -> (PrefillPath, Decision<FallbackReason>) {
    let path = if session_hit { PrefillPath::DirectAppend } else { PrefillPath::Local };
    (path, Decision::new(path.as_str(), FallbackReason::RemotePrefillFailed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Reason;

    #[test]
    fn a_failed_remote_prefill_is_computed_here_extending_a_resident_session() {
        let (path, d) = decide_fallback(true);
        assert_eq!((path, d.outcome, d.reason), (PrefillPath::DirectAppend, "direct_append", FallbackReason::RemotePrefillFailed));
        let (path, d) = decide_fallback(false);
        assert_eq!((path, d.outcome), (PrefillPath::Local, "local"));
    }

    #[test]
    fn its_outcomes_are_the_paths_here() {
        let here: Vec<_> = [PrefillPath::DirectAppend, PrefillPath::Local].iter().map(|p| p.as_str()).collect();
        for r in FallbackReason::ALL {
            assert_eq!(r.outcomes(), here.as_slice(), "{r:?}");
        }
    }
}
