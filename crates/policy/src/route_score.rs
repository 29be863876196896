//! Where the router sends a request: one explicit score per worker, after
//! Dynamo's KV router: one explicit cost formula, each term logged.
//!
//! ```text
//! score = prefill_weight * blocks of prompt the worker lacks
//!       + decode load in blocks (total - free - evictable)
//!       + active_weight * active requests (running + waiting)
//! ```
//!
//! Units are KV blocks. The worker "lacks" the prompt tokens not covered by
//! the session's resident tokens on it (any tier), counted in whole blocks
//! as the engine reuses them. A worker whose free + evictable blocks cannot
//! hold the whole request (prompt + `max_tokens`: the session's reused
//! blocks are among its evictable ones, or on the host tier and brought
//! back) has no room and scores infinite; an unhealthy worker is not a
//! candidate at all.
//!
//! Session ids match exactly: the router looks a session up in each
//! worker's published map by equality, never by prefix (vLLM router #219
//! sent `session-12` to `session-1`'s worker).
//!
//! The function is pure: the router builds the [`WorkerView`]s from the
//! workers' polled `/internal/state` plus what it knows more recently
//! (requests it has in flight, the turn it just placed), and logs the
//! returned [`RouteDecision`] as it is ([`RouteDecision::decision`]).

use crate::decision::{Decision, Reason};

/// A request as the router sees it (estimates; the router does not tokenize).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteRequest {
    /// Estimated prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens the request may add beyond the prompt (`max_tokens` x `n`).
    pub max_tokens: usize,
    /// The worker that served the session's last turn (index into the
    /// views), if the router knows one. Without it, the worker holding most
    /// of the session's tokens counts as its home.
    pub home: Option<usize>,
}

/// One worker's state as the policy needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerView {
    pub healthy: bool,
    pub block_size: usize,
    pub total_blocks: usize,
    pub free_blocks: usize,
    pub evictable_blocks: usize,
    /// Running + waiting requests.
    pub active: usize,
    /// The request's session's tokens resident on this worker (any tier);
    /// 0 without a session.
    pub resident_tokens: usize,
}

impl WorkerView {
    pub fn available_blocks(&self) -> usize {
        self.free_blocks + self.evictable_blocks
    }
}

/// The knobs of the score, in blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteWeights {
    /// Cost of one block of prompt to compute (Dynamo's overlap weight).
    pub prefill_weight: f64,
    /// Cost of one active request, in blocks: separates workers whose
    /// queued work is not in their block counts yet.
    pub active_weight: f64,
}

impl Default for RouteWeights {
    fn default() -> Self {
        Self { prefill_weight: 1.0, active_weight: 1.0 }
    }
}

/// The terms of one worker's score, for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerScore {
    /// Prompt tokens the worker already holds (whole blocks of the session).
    pub reused_tokens: usize,
    /// Blocks of prompt to compute there.
    pub prefill_blocks: usize,
    pub decode_blocks: usize,
    pub active: usize,
    /// Blocks the request would add (prefill + `max_tokens`).
    pub needed_blocks: usize,
    pub available_blocks: usize,
    /// The weighted sum without the room rule.
    pub cost: f64,
    /// `cost`, or infinite without room; `None`: not a candidate (unhealthy).
    pub score: Option<f64>,
}

impl std::fmt::Display for WorkerScore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.score {
            None => write!(f, "unhealthy"),
            Some(s) => write!(
                f,
                "{s:.1} (prefill {} + decode {} + active {}; reused {} tok, needs {}/{} blocks)",
                self.prefill_blocks, self.decode_blocks, self.active, self.reused_tokens, self.needed_blocks, self.available_blocks
            ),
        }
    }
}

crate::decision::reasons! {
    /// Why a worker was chosen (or none): the `reason` of
    /// `kvc_decisions_total{decision="route_score"}`.
    pub enum RouteReason in "route_score" {
        /// The session's home worker is the cheapest.
        SessionResident("session_resident") => "place",
        /// No session home: the cheapest worker.
        LeastCost("least_cost") => "place",
        /// The session's home has no room for the request: moved.
        MovedFull("moved_full") => "place",
        /// The session's home is unhealthy: moved.
        MovedUnhealthy("moved_unhealthy") => "place",
        /// The home has room but another worker is cheaper even after
        /// recomputing the session there (the home is loaded).
        MovedLoad("moved_load") => "place",
        /// No healthy worker has room now: the cheapest healthy one queues it.
        NoRoom("no_room") => "queue",
        /// No healthy worker at all: the request fails (503).
        NoHealthyWorker("no_healthy_worker") => "refuse",
    }
}

impl RouteReason {
    /// The reasons that move a session off its home.
    pub const MOVES: [RouteReason; 3] = [RouteReason::MovedFull, RouteReason::MovedUnhealthy, RouteReason::MovedLoad];
}

impl std::fmt::Display for RouteReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteDecision {
    /// Index into the views; `None` only for [`RouteReason::NoHealthyWorker`].
    pub worker: Option<usize>,
    pub reason: RouteReason,
    /// The session's home as the policy saw it.
    pub home: Option<usize>,
    /// One per view, in order.
    pub scores: Vec<WorkerScore>,
}

impl RouteDecision {
    /// True when the session leaves its home worker.
    pub fn is_move(&self) -> bool {
        matches!((self.home, self.worker), (Some(h), Some(w)) if h != w)
    }

    /// Counted and logged as `route_score`; the terms are the chosen
    /// worker's (none without one).
    pub fn decision(&self) -> Decision<RouteReason> {
        let d = Decision::new(self.reason.outcomes()[0], self.reason);
        match self.worker.map(|w| &self.scores[w]) {
            Some(s) => d
                .term("cost", s.cost)
                .term("prefill_blocks", s.prefill_blocks as f64)
                .term("decode_blocks", s.decode_blocks as f64)
                .term("active", s.active as f64)
                .term("reused_tokens", s.reused_tokens as f64),
            None => d,
        }
    }

    /// `w0=… w1=…` for the log line.
    pub fn scores_text(&self) -> String {
        self.scores.iter().enumerate().map(|(i, s)| format!("w{i}={s}")).collect::<Vec<_>>().join("; ")
    }
}

/// The terms for one worker.
pub fn score_worker(req: &RouteRequest, w: &WorkerView, weights: &RouteWeights) -> WorkerScore {
    let bs = w.block_size.max(1);
    // The engine's admission estimate: whole blocks, the last token computed.
    let reused_tokens = crate::reusable_tokens(w.resident_tokens, req.prompt_tokens, bs);
    let lacking = req.prompt_tokens - reused_tokens;
    let prefill_blocks = lacking.div_ceil(bs);
    // The reused blocks stay in use too: the whole request must fit.
    let needed_blocks = (req.prompt_tokens + req.max_tokens).div_ceil(bs);
    let decode_blocks = w.total_blocks.saturating_sub(w.available_blocks());
    let cost = weights.prefill_weight * prefill_blocks as f64 + decode_blocks as f64 + weights.active_weight * w.active as f64;
    let score = w.healthy.then(|| if needed_blocks > w.available_blocks() { f64::INFINITY } else { cost });
    WorkerScore {
        reused_tokens,
        prefill_blocks,
        decode_blocks,
        active: w.active,
        needed_blocks,
        available_blocks: w.available_blocks(),
        cost,
        score,
    }
}

/// The placement policy: the cheapest worker with room; ties go to the
/// session's home, then to the lower index.
pub fn choose_worker(req: &RouteRequest, workers: &[WorkerView], weights: &RouteWeights) -> RouteDecision {
    let scores: Vec<WorkerScore> = workers.iter().map(|w| score_worker(req, w, weights)).collect();
    let home = req.home.filter(|&h| h < workers.len()).or_else(|| {
        // The worker holding most of the session (exact id match upstream).
        (0..workers.len()).filter(|&i| workers[i].resident_tokens > 0).max_by_key(|&i| (workers[i].resident_tokens, std::cmp::Reverse(i)))
    });
    let pick = |key: &dyn Fn(&WorkerScore) -> Option<f64>| -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, s) in scores.iter().enumerate() {
            let Some(v) = key(s).filter(|v| v.is_finite()) else {
                continue;
            };
            let better = match best {
                None => true,
                Some((b, bv)) => v < bv || (v == bv && Some(i) == home && Some(b) != home),
            };
            if better {
                best = Some((i, v));
            }
        }
        best.map(|(i, _)| i)
    };
    let decision = |worker, reason| RouteDecision { worker, reason, home, scores: scores.clone() };
    if scores.iter().all(|s| s.score.is_none()) {
        return decision(None, RouteReason::NoHealthyWorker);
    }
    let Some(best) = pick(&|s| s.score) else {
        // Nobody has room now: queue on the cheapest healthy worker (its
        // engine waits or preempts; a request larger than any pool gets the
        // worker's own error).
        return decision(pick(&|s| s.score.map(|_| s.cost)), RouteReason::NoRoom);
    };
    let reason = match home {
        None => RouteReason::LeastCost,
        Some(h) if h == best => RouteReason::SessionResident,
        Some(h) => match scores[h].score {
            None => RouteReason::MovedUnhealthy,
            Some(s) if s.is_infinite() => RouteReason::MovedFull,
            Some(_) => RouteReason::MovedLoad,
        },
    };
    decision(Some(best), reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(total: usize) -> WorkerView {
        WorkerView { healthy: true, block_size: 16, total_blocks: total, free_blocks: total, ..Default::default() }
    }

    fn req(prompt_tokens: usize, max_tokens: usize, home: Option<usize>) -> RouteRequest {
        RouteRequest { prompt_tokens, max_tokens, home }
    }

    fn choose(r: &RouteRequest, w: &[WorkerView]) -> RouteDecision {
        choose_worker(r, w, &RouteWeights::default())
    }

    #[test]
    fn a_new_request_goes_to_the_least_loaded_worker() {
        let busy = WorkerView { free_blocks: 60, active: 3, ..idle(100) }; // 40 blocks decoding
        let d = choose(&req(100, 16, None), &[busy, idle(100)]);
        assert_eq!((d.worker, d.reason), (Some(1), RouteReason::LeastCost));
        assert_eq!(d.scores[0].decode_blocks, 40);
        assert_eq!(d.scores[0].score, Some(7.0 + 40.0 + 3.0));
        assert_eq!(d.scores[1].score, Some(7.0));
        assert!(!d.is_move());
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let d = choose(&req(10, 10, None), &[idle(100), idle(100)]);
        assert_eq!((d.worker, d.reason), (Some(0), RouteReason::LeastCost));
    }

    #[test]
    fn the_session_stays_where_its_tokens_are() {
        // A little busier, but holds 18 blocks of the prompt.
        let home = WorkerView { resident_tokens: 300, active: 1, ..idle(100) };
        let d = choose(&req(320, 32, None), &[idle(100), home]);
        assert_eq!((d.worker, d.reason, d.home), (Some(1), RouteReason::SessionResident, Some(1)));
        assert_eq!(d.scores[1].reused_tokens, 288);
        assert_eq!(d.scores[1].prefill_blocks, 2);
        assert_eq!(d.scores[0].prefill_blocks, 20);
    }

    #[test]
    fn a_tie_goes_to_the_sessions_home() {
        let d = choose(&req(10, 10, Some(1)), &[idle(100), idle(100)]);
        assert_eq!((d.worker, d.reason), (Some(1), RouteReason::SessionResident));
    }

    #[test]
    fn a_full_home_moves_the_session() {
        let home = WorkerView { free_blocks: 5, resident_tokens: 64, ..idle(40) };
        let d = choose(&req(80, 200, Some(0)), &[home, idle(100)]);
        assert_eq!((d.worker, d.reason), (Some(1), RouteReason::MovedFull));
        assert_eq!(d.scores[0].score, Some(f64::INFINITY));
        // The whole request must fit: 80 prompt + 200 new tokens.
        assert_eq!(d.scores[0].needed_blocks, (80 + 200usize).div_ceil(16));
        assert!(d.is_move());
    }

    #[test]
    fn room_counts_evictable_blocks() {
        // 38 blocks of idle sessions and prefix cache: reclaimable.
        let w = WorkerView { free_blocks: 2, evictable_blocks: 38, ..idle(40) };
        let d = choose(&req(100, 100, None), &[w]);
        assert_eq!((d.worker, d.reason), (Some(0), RouteReason::LeastCost));
        assert_eq!(d.scores[0].decode_blocks, 0);
    }

    #[test]
    fn an_unhealthy_home_moves_the_session() {
        let home = WorkerView { healthy: false, resident_tokens: 500, ..idle(100) };
        let d = choose(&req(520, 16, Some(0)), &[home, idle(100)]);
        assert_eq!((d.worker, d.reason), (Some(1), RouteReason::MovedUnhealthy));
        assert_eq!(d.scores[0].score, None);
        assert!(d.scores_text().contains("w0=unhealthy"), "{}", d.scores_text());
    }

    #[test]
    fn a_loaded_home_loses_when_recomputing_elsewhere_is_cheaper() {
        let home = WorkerView { resident_tokens: 32, free_blocks: 20, ..idle(100) }; // 80 blocks decoding
        let d = choose(&req(48, 16, Some(0)), &[home, idle(100)]);
        assert_eq!((d.worker, d.reason), (Some(1), RouteReason::MovedLoad));
    }

    #[test]
    fn a_higher_overlap_weight_keeps_a_long_session_home_under_load() {
        // The headline experiment's dp case: the home holds 7.6K of a 7.8K
        // prompt but decodes 4.9K blocks; the other worker decodes 1.5K.
        let home = WorkerView { resident_tokens: 7_632, free_blocks: 40_000 - 4_910, ..idle(40_000) };
        let other = WorkerView { free_blocks: 40_000 - 1_514, ..idle(40_000) };
        let r = req(7_793, 46, Some(0));
        assert_eq!(choose(&r, &[home.clone(), other.clone()]).reason, RouteReason::MovedLoad);
        let heavy = RouteWeights { prefill_weight: 10.0, ..RouteWeights::default() };
        let d = choose_worker(&r, &[home, other], &heavy);
        assert_eq!((d.worker, d.reason), (Some(0), RouteReason::SessionResident));
    }

    #[test]
    fn without_room_anywhere_the_cheapest_healthy_worker_queues_it() {
        let a = WorkerView { free_blocks: 0, active: 4, ..idle(40) };
        let b = WorkerView { free_blocks: 1, active: 2, ..idle(40) };
        let dead = WorkerView { healthy: false, ..idle(1000) };
        let d = choose(&req(100, 100, None), &[a, b, dead]);
        assert_eq!((d.worker, d.reason), (Some(1), RouteReason::NoRoom));
        assert!(d.scores[..2].iter().all(|s| s.score == Some(f64::INFINITY)));
    }

    #[test]
    fn no_healthy_worker_means_none() {
        let a = WorkerView { healthy: false, ..idle(40) };
        let d = choose(&req(10, 10, None), &[a]);
        assert_eq!((d.worker, d.reason), (None, RouteReason::NoHealthyWorker));
        assert_eq!(choose(&req(10, 10, None), &[]).reason, RouteReason::NoHealthyWorker);
    }
}
