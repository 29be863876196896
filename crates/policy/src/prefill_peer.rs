//! Which prefill worker a decode worker asks: one pure function over typed
//! views of the peers, returning the choice and its reason (the third of
//! the placement decisions, beside [`crate::prefill_path`] and the router's
//! `kvc_disagg::routing`). Counted as `kvc_prefill_peer_choices_total{reason}`
//! by the decode worker, every [`PeerReason`] at 0.
//!
//! In order:
//! 1. a healthy peer that holds a snapshot of the session (the most
//!    tokens): `snapshot_holder`, so a bypass can reuse it;
//! 2. the session's stable home (FNV-1a of the id over the peers), when
//!    healthy: `session_home`, so one peer accumulates its snapshot;
//! 3. the least loaded healthy peer (running + waiting): `least_loaded`;
//! 4. with none healthy, the first peer: `none_healthy` (the caller then
//!    falls back to computing locally).

/// What the decision sees of one prefill peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerCandidate {
    pub healthy: bool,
    /// Its last report's running + waiting; None before any report.
    pub load: Option<usize>,
    /// Tokens of the session's snapshot it holds (0: none).
    pub snapshot_tokens: usize,
    pub holds_snapshot: bool,
}

crate::decision::reasons! {
    /// Why a peer was chosen.
    pub enum PeerReason in "prefill_peer" {
        // Without a healthy one the first is still asked (flagged): every
        // reason's outcome is `chosen`.
        /// A healthy peer holds a snapshot of the session (the most tokens).
        SnapshotHolder("snapshot_holder") => "chosen",
        /// The session's stable home, healthy.
        SessionHome("session_home") => "chosen",
        /// The least loaded healthy peer.
        LeastLoaded("least_loaded") => "chosen",
        /// No peer is healthy: the first one.
        NoneHealthy("none_healthy") => "chosen",
    }
}

impl PeerReason {
    pub fn decision(self) -> crate::decision::Decision<PeerReason> {
        crate::decision::Decision::new("chosen", self)
    }
}

/// The chosen peer (an index into the candidates) and why; None without
/// candidates.
pub fn choose_peer(peers: &[PeerCandidate], session: Option<&str>) -> Option<(usize, PeerReason)> {
    if peers.is_empty() {
        return None;
    }
    let healthy = || peers.iter().enumerate().filter(|(_, p)| p.healthy);
    if let Some(s) = session {
        if let Some((i, _)) = healthy().filter(|(_, p)| p.holds_snapshot).max_by_key(|(i, p)| (p.snapshot_tokens, std::cmp::Reverse(*i))) {
            return Some((i, PeerReason::SnapshotHolder));
        }
        let home = stable_index(s, peers.len());
        if peers[home].healthy {
            return Some((home, PeerReason::SessionHome));
        }
    }
    match healthy().min_by_key(|(i, p)| (p.load.unwrap_or(usize::MAX), *i)) {
        Some((i, _)) => Some((i, PeerReason::LeastLoaded)),
        None => Some((0, PeerReason::NoneHealthy)),
    }
}

/// FNV-1a of the session id, reduced to `n` (exact ids: `s-1` and `s-12`
/// hash apart).
pub fn stable_index(session: &str, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(healthy: bool, load: usize) -> PeerCandidate {
        PeerCandidate { healthy, load: Some(load), ..Default::default() }
    }

    #[test]
    fn snapshot_then_home_then_least_loaded_then_anyone() {
        assert_eq!(choose_peer(&[], Some("s")), None);
        let mut peers = vec![peer(true, 5), peer(true, 1), peer(true, 3)];
        // No session: the least loaded.
        assert_eq!(choose_peer(&peers, None), Some((1, PeerReason::LeastLoaded)));
        // A session: its stable home, whatever the load.
        let home = stable_index("conv-7", 3);
        assert_eq!(choose_peer(&peers, Some("conv-7")), Some((home, PeerReason::SessionHome)));
        // A healthy holder of its snapshot wins, the most tokens first.
        let other = (home + 1) % 3;
        peers[other].holds_snapshot = true;
        peers[other].snapshot_tokens = 64;
        assert_eq!(choose_peer(&peers, Some("conv-7")), Some((other, PeerReason::SnapshotHolder)));
        peers[other].healthy = false;
        assert_eq!(choose_peer(&peers, Some("conv-7")), Some((home, PeerReason::SessionHome)), "not an unhealthy holder");
        // The home down: the least loaded healthy one.
        peers[home].healthy = false;
        let left = 3 - home - other;
        assert_eq!(choose_peer(&peers, Some("conv-7")), Some((left, PeerReason::LeastLoaded)));
        // Nobody healthy: the first, flagged.
        peers[left].healthy = false;
        assert_eq!(choose_peer(&peers, Some("conv-7")), Some((0, PeerReason::NoneHealthy)));
    }

    #[test]
    fn stable_index_is_exact_and_spreads() {
        assert_eq!(stable_index("a", 4), stable_index("a", 4));
        let hits: std::collections::HashSet<usize> = (0..64).map(|i| stable_index(&format!("s-{i}"), 4)).collect();
        assert_eq!(hits.len(), 4);
    }
}
