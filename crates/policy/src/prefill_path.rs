//! Where a decode worker's prompt suffix gets computed: here (direct
//! append) or on a prefill worker (remote prefill, possibly bypassing what
//! its snapshot store covers). One pure function, [`decide`], returning the
//! decision and its typed reason ([`PathReason`]); the caller (the server's
//! `pd/decode.rs`) logs it (`event="prefill_path"`) and counts it
//! (`kvc_decisions_total{decision="prefill_path"}`, the path its outcome).
//!
//! It lives here, in `kvc-policy` (issue 32); `kvc_disagg::prefill_path`
//! re-exports it. The counter's label sets are closed: every (path, reason)
//! pair [`decide`] can return, and the caller's own `no_room_to_reserve`,
//! is listed by [`PathReason::pairs`], and a decode worker's registry
//! exports each at 0 from the start (no empty dashboard panels).
//!
//! The cost model compares estimated times, from measured rates:
//!
//! - local  = (this worker's prefill backlog + suffix) / the rate prefill
//!   gets here (with decodes running, the engine's decode-latency budget
//!   caps it: its measured mixed rate), plus the stall the prefill imposes
//!   on the decodes running here (each step of theirs carries a share of
//!   it): `running * suffix / local_rate`.
//! - remote = round trip + P's backlog / P's rate + (suffix - P's snapshot
//!   coverage) / P's rate + suffix bytes / transfer bandwidth.
//!
//! The backlogs are prompt tokens submitted but not yet computed: here,
//! what the engine holds and what was submitted since its last snapshot;
//! on P, what it last reported or what this worker has sent it and not
//! had answered, whichever is more (reports lag by a poll and a step).
//! Without them a burst of long prompts all look cheap on one side (each
//! sees an idle engine) and queue behind each other while the other idles.
//!
//! Suffixes shorter than `min_remote_tokens` never go remote: below it the
//! fixed costs (a round trip, block reservation, the transfer set-up)
//! dominate. Its default comes from the measured crossover in
//! docs/benchmarks.md.
//!
//! What a decode worker does when a remote prefill fails is
//! [`crate::prefill_fallback`]'s decision (re-exported here).

pub use crate::prefill_fallback::{decide_fallback, FallbackReason};

crate::decision::reasons! {
    /// Where a suffix is computed: the `outcome` label of its decision.
    pub enum PrefillPath {
        /// Computed on this worker, extending KV it holds (a resident session).
        DirectAppend("direct_append"),
        /// Computed on this worker from scratch or from its prefix cache.
        Local("local"),
        /// Computed on a prefill worker and transferred here.
        Remote("remote_prefill"),
    }
}

impl PrefillPath {
    /// The serving path it is (a remote prefill that reused P's snapshot is
    /// [`kvc_wire::ServePath::Bypass`], decided after the fact).
    pub fn serve_path(self) -> kvc_wire::ServePath {
        match self {
            PrefillPath::DirectAppend => kvc_wire::ServePath::DirectAppend,
            PrefillPath::Local => kvc_wire::ServePath::Local,
            PrefillPath::Remote => kvc_wire::ServePath::RemotePrefill,
        }
    }
}

crate::decision::reasons! {
    /// Why a suffix is computed where it is: the `reason` label of
    /// `kvc_decisions_total{decision="prefill_path"}` and of the
    /// `prefill_path` log event.
    pub enum PathReason in "prefill_path" {
        /// No prefill worker is configured (or none was picked).
        NoPrefillPeer("no_prefill_peer"),
        /// The prefill worker failed its last state poll.
        PrefillPeerUnhealthy("prefill_peer_unhealthy"),
        /// The suffix is below `min_remote_tokens` and P holds no snapshot of it.
        SuffixBelowThreshold("suffix_below_threshold"),
        /// Threshold policy: the suffix is at or above `min_remote_tokens`.
        SuffixAboveThreshold("suffix_above_threshold"),
        /// Threshold policy: P's snapshot covers a prefix this worker lacks.
        SnapshotCoversPrefix("snapshot_covers_prefix"),
        /// Cost policy: the remote path, reusing P's snapshot, is cheaper.
        SnapshotBypassCheaper("snapshot_bypass_cheaper"),
        /// Cost policy: the remote path is cheaper.
        RemoteCheaper("remote_cheaper"),
        /// Cost policy: computing here is cheaper (or as cheap).
        LocalCheaper("local_cheaper"),
        /// The caller's, not [`decide`]'s: reserving the prompt's blocks (which a
        /// remote prefill needs) failed, so the engine serves it as it can.
        NoRoomToReserve("no_room_to_reserve"),
        /// The caller's, not [`decide`]'s: a request for several choices (`n` >
        /// 1) is computed here, once for all of them (they share the prompt's
        /// blocks); a remote prefill fills one sequence.
        MultipleChoices("multiple_choices"),
        /// The caller's, not [`decide`]'s: a request for the prompt's logprobs
        /// (scoring) is computed here: a remote prefill returns the prompt's KV,
        /// not its logits.
        PromptLogprobs("prompt_logprobs"),
    }
    // The labels of its paths ([`PathReason::paths`]).
    outcomes = |r| match r.paths() {
        [PrefillPath::Remote] => &["remote_prefill"],
        [PrefillPath::Local] => &["local"],
        _ => &["direct_append", "local"],
    }
}

impl PathReason {
    /// The paths a decision with this reason can take: a reason that keeps
    /// the suffix here goes with either path here (direct append when the
    /// held tokens are the request's own session), a remote one with
    /// [`PrefillPath::Remote`].
    pub fn paths(self) -> &'static [PrefillPath] {
        const HERE: &[PrefillPath] = &[PrefillPath::DirectAppend, PrefillPath::Local];
        match self {
            PathReason::NoPrefillPeer | PathReason::PrefillPeerUnhealthy | PathReason::SuffixBelowThreshold | PathReason::LocalCheaper => {
                HERE
            }
            PathReason::SuffixAboveThreshold
            | PathReason::SnapshotCoversPrefix
            | PathReason::SnapshotBypassCheaper
            | PathReason::RemoteCheaper => &[PrefillPath::Remote],
            // Without a reservation nothing is held: never a direct append.
            PathReason::NoRoomToReserve | PathReason::MultipleChoices | PathReason::PromptLogprobs => &[PrefillPath::Local],
        }
    }

    /// Every (path, reason) label set of
    /// `kvc_decisions_total{decision="prefill_path"}` (the path its outcome):
    /// what [`decide`] can return, and the caller's `no_room_to_reserve`.
    pub fn pairs() -> impl Iterator<Item = (PrefillPath, PathReason)> {
        PathReason::ALL.into_iter().flat_map(|r| r.paths().iter().map(move |&p| (p, r)))
    }
}

impl std::fmt::Display for PathReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How suffixes at or above the threshold are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathPolicy {
    /// By the cost model.
    #[default]
    Cost,
    /// Always remote (the classic disaggregated deployment: D never
    /// prefills more than `min_remote_tokens`).
    Threshold,
}

/// What the decode worker knows about a prefill worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerView {
    pub healthy: bool,
    /// Requests running + waiting there.
    pub queued_requests: usize,
    /// Its measured prompt tokens/s (0: unknown, assume ours).
    pub prefill_tokens_per_s: f64,
    /// Tokens of this session's snapshot there (0: none).
    pub snapshot_tokens: usize,
    /// Prompt tokens admitted there and not yet computed (0: none, or a
    /// peer that does not report it; then `queued_requests` stands in).
    pub pending_prefill_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathInputs {
    pub prompt_tokens: usize,
    /// Leading tokens whose KV this worker holds (whole blocks).
    pub held_tokens: usize,
    /// Whether the held tokens are the request's own session.
    pub session_hit: bool,
    /// Requests running here (decodes a local prefill would stall).
    pub running: usize,
    /// This worker's measured prompt tokens/s (0: unknown).
    pub local_tokens_per_s: f64,
    /// Prompt tokens/s a prefill gets here while decodes run, under the
    /// engine's step budget (0: unknown or not limited).
    pub local_mixed_tokens_per_s: f64,
    /// Prompt tokens admitted here and not yet computed.
    pub local_pending_tokens: usize,
    /// KV bytes per token (all layers, K and V).
    pub kv_bytes_per_token: u64,
    /// Measured transfer bandwidth to/from prefill workers, bytes/s.
    pub transfer_bytes_per_s: f64,
    /// Measured round trip of a remote prefill's control messages, seconds.
    pub round_trip_s: f64,
    pub min_remote_tokens: usize,
    pub policy: PathPolicy,
    /// The prefill worker that would serve it, if any is configured.
    pub peer: Option<PeerView>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathDecision {
    pub path: PrefillPath,
    pub reason: PathReason,
    /// Estimated seconds (0 when not estimated).
    pub local_s: f64,
    pub remote_s: f64,
    /// Prompt tokens the prefill worker would compute on the remote path
    /// (the suffix less what its snapshot covers).
    pub peer_tokens: usize,
}

/// Rate assumed before any measurement: the embedded CPU model's order of
/// magnitude; replaced by the first measured step.
const DEFAULT_TOKENS_PER_S: f64 = 2_000.0;

pub fn decide(i: &PathInputs) -> PathDecision {
    let suffix = i.prompt_tokens.saturating_sub(i.held_tokens);
    let here = if i.session_hit && i.held_tokens > 0 { PrefillPath::DirectAppend } else { PrefillPath::Local };
    let Some(peer) = i.peer else {
        return PathDecision { path: here, reason: PathReason::NoPrefillPeer, local_s: 0.0, remote_s: 0.0, peer_tokens: suffix };
    };
    // A snapshot on P counts only as far as D does not hold the prompt already.
    // Token granularity (block size 1): P's block size is not among the inputs.
    let bypass = crate::reusable_tokens(peer.snapshot_tokens, i.prompt_tokens, 1).saturating_sub(i.held_tokens);
    let peer_tokens = suffix.saturating_sub(bypass);
    let done = |path, reason, local_s, remote_s| PathDecision { path, reason, local_s, remote_s, peer_tokens };
    if !peer.healthy {
        return done(here, PathReason::PrefillPeerUnhealthy, 0.0, 0.0);
    }
    if suffix < i.min_remote_tokens && bypass == 0 {
        return done(here, PathReason::SuffixBelowThreshold, 0.0, 0.0);
    }
    let local_rate = if i.local_tokens_per_s > 0.0 { i.local_tokens_per_s } else { DEFAULT_TOKENS_PER_S };
    let peer_rate = if peer.prefill_tokens_per_s > 0.0 { peer.prefill_tokens_per_s } else { local_rate };
    let local_compute = suffix as f64 / local_rate;
    let rate_now = if i.running > 0 && i.local_mixed_tokens_per_s > 0.0 { i.local_mixed_tokens_per_s.min(local_rate) } else { local_rate };
    let local_s = (i.local_pending_tokens + suffix) as f64 / rate_now + local_compute * i.running as f64;
    let peer_queue_s = if peer.pending_prefill_tokens > 0 {
        peer.pending_prefill_tokens as f64 / peer_rate
    } else {
        peer.queued_requests as f64 * local_compute.max(0.001)
    };
    let transfer_s = (suffix as u64 * i.kv_bytes_per_token) as f64 / i.transfer_bytes_per_s.max(1.0);
    let remote_s = i.round_trip_s + peer_queue_s + peer_tokens as f64 / peer_rate + transfer_s;
    if i.policy == PathPolicy::Threshold {
        let reason = if bypass > 0 { PathReason::SnapshotCoversPrefix } else { PathReason::SuffixAboveThreshold };
        return done(PrefillPath::Remote, reason, local_s, remote_s);
    }
    if remote_s < local_s {
        let reason = if bypass > 0 { PathReason::SnapshotBypassCheaper } else { PathReason::RemoteCheaper };
        done(PrefillPath::Remote, reason, local_s, remote_s)
    } else {
        done(here, PathReason::LocalCheaper, local_s, remote_s)
    }
}

impl PathDecision {
    /// A decision taken without the cost model (no estimates).
    pub fn without_estimates(path: PrefillPath, reason: PathReason, peer_tokens: usize) -> Self {
        PathDecision { path, reason, local_s: 0.0, remote_s: 0.0, peer_tokens }
    }

    pub fn decision(&self) -> crate::decision::Decision<PathReason> {
        crate::decision::Decision::new(self.path.as_str(), self.reason)
            .term("local_s", self.local_s)
            .term("remote_s", self.remote_s)
            .term("peer_tokens", self.peer_tokens as f64)
    }
}

/// What a decode worker knows before it reserves a prompt's blocks.
#[derive(Debug, Clone, Copy)]
pub struct PreReservationInputs {
    /// A prefill worker was picked.
    pub peer: bool,
    pub prompt_tokens: usize,
    pub min_remote_tokens: usize,
    pub has_session: bool,
}

/// The decision before any reservation: without a peer, or for a prompt
/// below the threshold without a session (whose snapshot on P could still
/// make the remote path worth it), the suffix cannot go remote, so no
/// reservation round trip is made: [`PrefillPath::Local`]. None: reserve,
/// then [`decide`] (or [`decide_unreserved`] when the reservation fails).
pub fn decide_before_reservation(i: &PreReservationInputs) -> Option<PathDecision> {
    let reason = if !i.peer {
        PathReason::NoPrefillPeer
    } else if i.prompt_tokens < i.min_remote_tokens && !i.has_session {
        PathReason::SuffixBelowThreshold
    } else {
        return None;
    };
    Some(PathDecision::without_estimates(PrefillPath::Local, reason, i.prompt_tokens))
}

/// The decision when reserving the prompt's blocks failed: nothing is held
/// and a remote prefill has nowhere to write, so the engine serves it as
/// it can (it preempts or waits).
pub fn decide_unreserved(prompt_tokens: usize) -> PathDecision {
    PathDecision::without_estimates(PrefillPath::Local, PathReason::NoRoomToReserve, prompt_tokens)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn inputs() -> PathInputs {
        PathInputs {
            prompt_tokens: 4096,
            held_tokens: 0,
            session_hit: false,
            running: 0,
            local_tokens_per_s: 10_000.0,
            local_mixed_tokens_per_s: 0.0,
            local_pending_tokens: 0,
            kv_bytes_per_token: 100_000,
            transfer_bytes_per_s: 10e9,
            round_trip_s: 0.002,
            min_remote_tokens: 512,
            policy: PathPolicy::Cost,
            peer: Some(PeerView {
                healthy: true,
                queued_requests: 0,
                prefill_tokens_per_s: 10_000.0,
                snapshot_tokens: 0,
                pending_prefill_tokens: 0,
            }),
        }
    }

    #[test]
    fn no_or_unhealthy_peer_stays_local() {
        let mut i = inputs();
        i.peer = None;
        assert_eq!(decide(&i).reason, PathReason::NoPrefillPeer);
        i.peer = Some(PeerView { healthy: false, ..inputs().peer.unwrap() });
        assert_eq!(decide(&i).reason, PathReason::PrefillPeerUnhealthy);
        assert_eq!(decide(&i).path, PrefillPath::Local);
    }

    #[test]
    fn a_short_suffix_of_a_resident_session_is_appended_here() {
        let mut i = inputs();
        i.held_tokens = 4000;
        i.session_hit = true;
        let d = decide(&i);
        assert_eq!((d.path, d.reason), (PrefillPath::DirectAppend, PathReason::SuffixBelowThreshold));
    }

    #[test]
    fn a_long_cold_prompt_goes_remote_when_decodes_run_here_and_stays_when_idle_and_transfer_is_slow() {
        let mut i = inputs();
        i.running = 8;
        let d = decide(&i);
        assert_eq!((d.path, d.reason), (PrefillPath::Remote, PathReason::RemoteCheaper));
        assert!(d.remote_s < d.local_s);
        // Idle here, same rates there, a slow link: local wins.
        let mut i = inputs();
        i.transfer_bytes_per_s = 1e8;
        assert_eq!(decide(&i).reason, PathReason::LocalCheaper);
        // A busy prefill worker: local wins.
        let mut i = inputs();
        i.running = 1;
        i.peer = Some(PeerView { queued_requests: 50, ..inputs().peer.unwrap() });
        assert_eq!(decide(&i).path, PrefillPath::Local);
    }

    #[test]
    fn a_prefill_backlog_here_sends_a_long_prompt_to_an_idle_prefill_worker() {
        // Idle decodes, same rates: alone, the prompt is cheaper here (no
        // transfer); behind 40K prompt tokens already admitted here it is not.
        let mut i = inputs();
        assert_eq!(decide(&i).path, PrefillPath::Local);
        i.local_pending_tokens = 40_000;
        let d = decide(&i);
        assert_eq!((d.path, d.reason), (PrefillPath::Remote, PathReason::RemoteCheaper));
        assert!((d.local_s - (40_000.0 + 4096.0) / 10_000.0).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn a_prefill_backlog_on_the_prefill_worker_keeps_the_prompt_here() {
        let mut i = inputs();
        i.running = 8;
        assert_eq!(decide(&i).path, PrefillPath::Remote);
        // 8 decodes stall for 0.41 s each here; P first computes 500K tokens.
        i.peer = Some(PeerView { pending_prefill_tokens: 500_000, ..inputs().peer.unwrap() });
        let d = decide(&i);
        assert_eq!((d.path, d.reason), (PrefillPath::Local, PathReason::LocalCheaper));
        assert!(d.remote_s > 50.0, "{d:?}");
    }

    #[test]
    fn the_threshold_policy_sends_every_long_suffix_remote() {
        let mut i = inputs();
        i.policy = PathPolicy::Threshold;
        assert_eq!(decide(&i).reason, PathReason::SuffixAboveThreshold);
        i.prompt_tokens = 100;
        assert_eq!(decide(&i).path, PrefillPath::Local);
    }

    #[test]
    fn a_snapshot_on_the_prefill_worker_makes_a_moved_session_go_remote() {
        let mut i = inputs();
        i.prompt_tokens = 300;
        i.peer = Some(PeerView { snapshot_tokens: 288, ..inputs().peer.unwrap() });
        let d = decide(&i);
        assert_eq!((d.path, d.reason), (PrefillPath::Remote, PathReason::SnapshotBypassCheaper));
        assert_eq!(d.peer_tokens, 300 - 288, "P computes only what its snapshot lacks");
        // ... but not when this worker already holds what the snapshot covers.
        i.held_tokens = 288;
        i.session_hit = true;
        assert_eq!(decide(&i).path, PrefillPath::DirectAppend);
    }

    #[test]
    fn the_step_budget_slows_local_prefill_while_decodes_run() {
        // 4096 tokens, 2 decodes here: unbudgeted 0.41 s + 2 * 0.41 s stall.
        let base = PathInputs { running: 2, ..inputs() };
        let free = decide(&base);
        assert!((free.local_s - 3.0 * 4096.0 / 10_000.0).abs() < 1e-9, "{free:?}");
        // Under a budget that leaves prefill 2,000 tokens/s beside decodes.
        let capped = decide(&PathInputs { local_mixed_tokens_per_s: 2_000.0, ..base });
        assert!((capped.local_s - (4096.0 / 2_000.0 + 2.0 * 4096.0 / 10_000.0)).abs() < 1e-9, "{capped:?}");
        // Nothing decoding: the budget does not apply.
        let idle = decide(&PathInputs { local_mixed_tokens_per_s: 2_000.0, running: 0, ..inputs() });
        assert!((idle.local_s - 4096.0 / 10_000.0).abs() < 1e-9);
    }

    /// The inputs of the tests above, and a grid over every input a branch
    /// of [`decide`] reads.
    fn sweep() -> Vec<PathInputs> {
        let peer = inputs().peer.unwrap();
        let mut all = vec![
            PathInputs { peer: None, ..inputs() },
            PathInputs { peer: Some(PeerView { healthy: false, ..peer }), ..inputs() },
            PathInputs { held_tokens: 4000, session_hit: true, ..inputs() },
            PathInputs { running: 8, ..inputs() },
            PathInputs { transfer_bytes_per_s: 1e8, ..inputs() },
            PathInputs { running: 1, peer: Some(PeerView { queued_requests: 50, ..peer }), ..inputs() },
            PathInputs { local_pending_tokens: 40_000, ..inputs() },
            PathInputs { running: 8, peer: Some(PeerView { pending_prefill_tokens: 500_000, ..peer }), ..inputs() },
            PathInputs { policy: PathPolicy::Threshold, ..inputs() },
            PathInputs { prompt_tokens: 100, policy: PathPolicy::Threshold, ..inputs() },
            PathInputs { prompt_tokens: 300, peer: Some(PeerView { snapshot_tokens: 288, ..peer }), ..inputs() },
        ];
        for policy in [PathPolicy::Cost, PathPolicy::Threshold] {
            for peer in [None, Some(PeerView { healthy: false, ..peer }), Some(peer)] {
                for (prompt, held) in [(300, 0), (300, 288), (4096, 0), (4096, 4000), (4096, 1000)] {
                    for session_hit in [false, true] {
                        for snapshot in [0, 288, 4000] {
                            for (running, pending, transfer) in [(0, 0, 10e9), (8, 0, 10e9), (0, 0, 1e6), (0, 40_000, 10e9)] {
                                all.push(PathInputs {
                                    prompt_tokens: prompt,
                                    held_tokens: held,
                                    session_hit,
                                    running,
                                    local_pending_tokens: pending,
                                    transfer_bytes_per_s: transfer,
                                    policy,
                                    peer: peer.map(|p| PeerView { snapshot_tokens: snapshot, ..p }),
                                    ..inputs()
                                });
                            }
                        }
                    }
                }
            }
        }
        all
    }

    #[test]
    fn the_label_table_is_exactly_what_decide_returns_and_the_callers_reason() {
        let table: HashSet<_> = PathReason::pairs().collect();
        assert_eq!(table.len(), PathReason::pairs().count(), "no pair twice");
        let returned: HashSet<_> = sweep().iter().map(decide).map(|d| (d.path, d.reason)).collect();
        let outside: Vec<_> = returned.difference(&table).collect();
        assert!(outside.is_empty(), "decide returned pairs the label table lacks: {outside:?}");
        // Only the callers' own reasons are never decide's.
        let unreached: HashSet<_> = table.difference(&returned).copied().collect();
        assert_eq!(
            unreached,
            HashSet::from([
                (PrefillPath::Local, PathReason::NoRoomToReserve),
                (PrefillPath::Local, PathReason::MultipleChoices),
                (PrefillPath::Local, PathReason::PromptLogprobs)
            ])
        );
    }

    #[test]
    fn the_lists_hold_every_variant_once_with_todays_labels() {
        // A new variant fails to compile here: list it in ALL and below too.
        for r in PathReason::ALL {
            match r {
                PathReason::NoPrefillPeer
                | PathReason::PrefillPeerUnhealthy
                | PathReason::SuffixBelowThreshold
                | PathReason::SuffixAboveThreshold
                | PathReason::SnapshotCoversPrefix
                | PathReason::SnapshotBypassCheaper
                | PathReason::RemoteCheaper
                | PathReason::LocalCheaper
                | PathReason::NoRoomToReserve
                | PathReason::MultipleChoices
                | PathReason::PromptLogprobs => {}
            }
        }
        for p in PrefillPath::ALL {
            match p {
                PrefillPath::DirectAppend | PrefillPath::Local | PrefillPath::Remote => {}
            }
        }
        let labels: Vec<_> = PathReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            labels,
            [
                "no_prefill_peer",
                "prefill_peer_unhealthy",
                "suffix_below_threshold",
                "suffix_above_threshold",
                "snapshot_covers_prefix",
                "snapshot_bypass_cheaper",
                "remote_cheaper",
                "local_cheaper",
                "no_room_to_reserve",
                "multiple_choices",
                "prompt_logprobs",
            ]
        );
        assert_eq!(HashSet::<_>::from_iter(PrefillPath::ALL.map(PrefillPath::as_str)).len(), 3);
        assert_eq!(PrefillPath::Remote.as_str(), "remote_prefill");
        // Every path occurs in the table.
        let paths: HashSet<_> = PathReason::pairs().map(|(p, _)| p).collect();
        assert_eq!(paths, HashSet::from(PrefillPath::ALL));
    }

    #[test]
    fn the_callers_decisions_before_and_after_the_reservation() {
        let pre = PreReservationInputs { peer: true, prompt_tokens: 100, min_remote_tokens: 512, has_session: false };
        let reason = |i: PreReservationInputs| decide_before_reservation(&i).map(|d| (d.path, d.reason));
        assert_eq!(reason(pre), Some((PrefillPath::Local, PathReason::SuffixBelowThreshold)));
        assert_eq!(reason(PreReservationInputs { peer: false, ..pre }), Some((PrefillPath::Local, PathReason::NoPrefillPeer)));
        assert_eq!(reason(PreReservationInputs { has_session: true, ..pre }), None);
        assert_eq!(reason(PreReservationInputs { prompt_tokens: 512, ..pre }), None);
        assert_eq!(decide_unreserved(9).reason, PathReason::NoRoomToReserve);
    }

    #[test]
    fn the_outcomes_are_the_paths_labels() {
        use crate::decision::Reason;
        for r in PathReason::ALL {
            let labels: Vec<_> = r.paths().iter().map(|p| p.as_str()).collect();
            assert_eq!(r.outcomes(), labels.as_slice(), "{r:?}");
        }
    }
}
