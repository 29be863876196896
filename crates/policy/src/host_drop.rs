//! Which idle session loses its host-tier KV when the host tier is full
//! and a demotion needs a slot, by [`decide_host_drop`]: the least
//! recently used one holding host blocks, never the session being served.
//! Counted as `kvc_evicted_blocks_total{tier="dropped",reason="host_full"}`
//! (its blocks) and `kvc_decisions_total{decision="host_drop"}`.

use std::time::Instant;

use crate::decision::Decision;

/// A session the host drop may take.
#[derive(Debug, Clone, Copy)]
pub struct HostDropCandidate {
    /// Not serving a request now.
    pub idle: bool,
    /// It is the session being made room for.
    pub is_requester: bool,
    /// It holds blocks on the host tier.
    pub on_host: bool,
    pub last_use: Instant,
}

crate::decision::reasons! {
    /// Why [`decide_host_drop`] dropped a session or none.
    pub enum HostDropReason in "host_drop" {
        /// The host tier is full: the least recently used idle session on it
        /// is dropped (all its tiers).
        HostFull("host_full") => "drop",
        /// No idle session other than the requester holds host blocks.
        NoCandidate("no_candidate") => "keep",
    }
}

/// The victim (an index into `candidates`, None: no candidate) and the
/// decision.
pub fn decide_host_drop(candidates: &[HostDropCandidate]) -> (Option<usize>, Decision<HostDropReason>) {
    let victim = (0..candidates.len())
        .filter(|&i| candidates[i].idle && !candidates[i].is_requester && candidates[i].on_host)
        .min_by_key(|&i| candidates[i].last_use);
    match victim {
        Some(i) => (Some(i), Decision::new("drop", HostDropReason::HostFull)),
        None => (None, Decision::new("keep", HostDropReason::NoCandidate)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_least_recently_used_idle_host_session_is_dropped_never_the_requester() {
        let t = Instant::now();
        let c = |idle, is_requester, on_host, age: u64| HostDropCandidate {
            idle,
            is_requester,
            on_host,
            last_use: t - Duration::from_secs(age),
        };
        let all = [
            c(true, false, true, 5),
            c(true, false, true, 9),
            c(false, false, true, 20),
            c(true, true, true, 30),
            c(true, false, false, 40),
        ];
        let (v, d) = decide_host_drop(&all);
        assert_eq!((v, d.outcome, d.reason), (Some(1), "drop", HostDropReason::HostFull));
        let (v, d) = decide_host_drop(&all[2..]);
        assert_eq!((v, d.outcome, d.reason), (None, "keep", HostDropReason::NoCandidate));
        assert_eq!(decide_host_drop(&[]).0, None);
    }
}
