//! Where a request's reused KV comes from at admission, by
//! [`decide_reuse`]: the session cache's answer (the session's own KV or
//! the prefix index's blocks), or a prefill worker's snapshot of the
//! session (prefill bypass), or nothing. The caller gathers what each
//! source offers, acquires from the one chosen, and logs the decision;
//! counted as `kvc_decisions_total{decision="kv_reuse"}`.

use crate::decision::Decision;

/// A source of reused KV; its labels are the outcomes of [`decide_reuse`]
/// (the same names as the session cache's `ReusePath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReuseSource {
    /// Nothing reused.
    Cold,
    /// The session's own KV.
    SessionHit,
    /// Blocks of the prefix index.
    PrefixHit,
    /// A prefill worker's snapshot of the session.
    Bypass,
}

impl ReuseSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ReuseSource::Cold => "cold",
            ReuseSource::SessionHit => "session_hit",
            ReuseSource::PrefixHit => "prefix_hit",
            ReuseSource::Bypass => "bypass",
        }
    }
}

/// What each source offers a request's prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReuseInputs {
    /// The session cache's answer, at most `limit` tokens: where it came
    /// from (`Cold` with 0 tokens when nothing) and its tokens.
    pub cache_source: ReuseSource,
    pub cache_tokens: usize,
    /// Tokens of the prompt the session's snapshot can serve (whole
    /// blocks, in either tier); None when the request asks for no snapshot
    /// (not a prefill worker's request for a session, or no store).
    pub snapshot_tokens: Option<usize>,
    /// Most leading tokens the request may reuse because it still owes
    /// prompt logprobs (cached KV has no logits); None: no limit.
    pub limit: Option<usize>,
}

crate::decision::reasons! {
    /// Why [`decide_reuse`] chose the source it did.
    pub enum ReuseReason in "kv_reuse" {
        /// No source offers a token.
        NothingCached("nothing_cached") => "cold",
        /// The session's own KV, and no snapshot asked for.
        SessionKv("session_kv") => "session_hit",
        /// The prefix index's blocks, and no snapshot asked for.
        PrefixKv("prefix_kv") => "prefix_hit",
        /// The snapshot serves at least what the session cache answered (ties
        /// go to the snapshot: the same KV, and the session's own).
        SnapshotCovers("snapshot_covers") => "bypass",
        /// A snapshot was asked for but serves fewer tokens than the session
        /// cache answered.
        SnapshotShort("snapshot_short") => "session_hit" | "prefix_hit",
        /// The request still owes prompt logprobs: the cache's answer stops at
        /// the limit and no snapshot is used.
        PromptLogprobsOwed("prompt_logprobs_owed") => "cold" | "session_hit" | "prefix_hit",
    }
}

/// The source a request reuses KV from, and the decision (its outcome the
/// source's label), with the offers as terms.
pub fn decide_reuse(i: &ReuseInputs) -> (ReuseSource, Decision<ReuseReason>) {
    debug_assert!((i.cache_source == ReuseSource::Cold) == (i.cache_tokens == 0), "{i:?}");
    debug_assert!(i.cache_source != ReuseSource::Bypass, "{i:?}");
    let cache = if i.cache_tokens == 0 { ReuseSource::Cold } else { i.cache_source };
    let (source, reason) = match (i.limit, i.snapshot_tokens) {
        (Some(_), _) => (cache, ReuseReason::PromptLogprobsOwed),
        (None, Some(s)) if s > 0 && s >= i.cache_tokens => (ReuseSource::Bypass, ReuseReason::SnapshotCovers),
        _ if cache == ReuseSource::Cold => (cache, ReuseReason::NothingCached),
        (None, Some(_)) => (cache, ReuseReason::SnapshotShort),
        (None, None) if cache == ReuseSource::SessionHit => (cache, ReuseReason::SessionKv),
        (None, None) => (cache, ReuseReason::PrefixKv),
    };
    let mut d = Decision::new(source.as_str(), reason).term("cache_tokens", i.cache_tokens as f64);
    if let Some(s) = i.snapshot_tokens {
        d = d.term("snapshot_tokens", s as f64);
    }
    if let Some(l) = i.limit {
        d = d.term("limit", l as f64);
    }
    (source, d)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::decision::Reason;

    fn inputs(cache_source: ReuseSource, cache_tokens: usize, snapshot_tokens: Option<usize>, limit: Option<usize>) -> ReuseInputs {
        ReuseInputs { cache_source, cache_tokens, snapshot_tokens, limit }
    }

    fn decide(i: ReuseInputs) -> (ReuseSource, ReuseReason) {
        let (source, d) = decide_reuse(&i);
        assert_eq!(d.outcome, source.as_str());
        (source, d.reason)
    }

    #[test]
    fn each_reason_is_reached_and_names_the_source_used() {
        use ReuseReason::*;
        use ReuseSource::*;
        let cases = [
            (inputs(Cold, 0, None, None), (Cold, NothingCached)),
            (inputs(Cold, 0, Some(0), None), (Cold, NothingCached)),
            (inputs(SessionHit, 64, None, None), (SessionHit, SessionKv)),
            (inputs(PrefixHit, 32, None, None), (PrefixHit, PrefixKv)),
            (inputs(Cold, 0, Some(48), None), (Bypass, SnapshotCovers)),
            (inputs(PrefixHit, 32, Some(48), None), (Bypass, SnapshotCovers)),
            (inputs(SessionHit, 48, Some(48), None), (Bypass, SnapshotCovers)),
            (inputs(SessionHit, 64, Some(48), None), (SessionHit, SnapshotShort)),
            (inputs(PrefixHit, 32, Some(0), None), (PrefixHit, SnapshotShort)),
            (inputs(Cold, 0, Some(48), Some(10)), (Cold, PromptLogprobsOwed)),
            (inputs(SessionHit, 10, Some(48), Some(10)), (SessionHit, PromptLogprobsOwed)),
            (inputs(PrefixHit, 8, None, Some(10)), (PrefixHit, PromptLogprobsOwed)),
        ];
        let mut reached = HashSet::new();
        for (i, want) in cases {
            assert_eq!(decide(i), want, "{i:?}");
            reached.insert(want.1);
        }
        assert_eq!(reached.len(), ReuseReason::ALL.len());
    }

    #[test]
    fn a_tie_goes_to_the_snapshot_and_an_empty_one_never_wins() {
        for cache in [0, 16, 1_024] {
            let src = if cache == 0 { ReuseSource::Cold } else { ReuseSource::PrefixHit };
            assert_eq!(decide(inputs(src, cache, Some(cache), None)).0 == ReuseSource::Bypass, cache > 0);
            assert_eq!(decide(inputs(src, cache, Some(cache + 16), None)).0, ReuseSource::Bypass);
        }
    }

    #[test]
    fn the_offers_are_the_terms_and_every_outcome_is_a_label_set() {
        let (_, d) = decide_reuse(&inputs(ReuseSource::SessionHit, 64, Some(48), Some(100)));
        assert_eq!(d.terms(), &[("cache_tokens", 64.0), ("snapshot_tokens", 48.0), ("limit", 100.0)]);
        let labels: HashSet<&str> = ReuseReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), ReuseReason::ALL.len());
        let outcomes: HashSet<&str> = ReuseReason::ALL.iter().flat_map(|r| r.outcomes().iter().copied()).collect();
        let sources = [ReuseSource::Cold, ReuseSource::SessionHit, ReuseSource::PrefixHit, ReuseSource::Bypass];
        assert_eq!(outcomes, sources.iter().map(|s| s.as_str()).collect());
    }
}
