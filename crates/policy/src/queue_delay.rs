//! Whether a worker takes a new prompt or answers 429 because it would
//! wait too long behind the prefill already queued (`--max-queue-delay-s`),
//! by [`decide_queue_delay`]. Counted as
//! `kvc_decisions_total{decision="queue_delay"}`, every pair of
//! [`QueueDelayReason::pairs`] exported at 0.
//!
//! Past capacity a queue only grows: every prompt taken then waits longer
//! than the one before, until prompts wait past their clients' timeouts and
//! the prefill spent on them is lost (at twice the capacity on one H200,
//! 21-35 % of the prefill computed went to requests whose clients had
//! given up). Refusing at the door what would wait longer than a bound
//! keeps the engine's work on prompts that will be answered, and tells the
//! client at once (429 with `Retry-After`) instead of after its timeout.
//!
//! The wait is estimated as the prompt tokens ahead (queued and
//! mid-prefill, those submitted since the last step included) over the
//! rate the backlog has drained at ([`crate::DrainRate`]: decodes, memory
//! waits and cache hits included). A prompt on an idle worker, or before
//! the rate is measured, is always taken.

/// `Retry-After` bounds, seconds.
pub const RETRY_AFTER_MIN_S: u64 = 1;
pub const RETRY_AFTER_MAX_S: u64 = 60;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueDelayInputs {
    /// `--max-queue-delay-s` (None: no bound).
    pub max_queue_delay_s: Option<f64>,
    /// Prompt tokens ahead of the new prompt (queued and mid-prefill).
    pub backlog_tokens: usize,
    /// Tokens per second the backlog drains at (0: not measured yet).
    pub drain_tokens_per_s: f64,
}

crate::decision::reasons! {
    /// Why [`decide_queue_delay`] takes a prompt or refuses it.
    pub enum QueueDelayReason in "queue_delay" {
        /// No `--max-queue-delay-s`.
        NoBound("no_bound"),
        /// Nothing is queued: the prompt starts at once.
        NoBacklog("no_backlog"),
        /// The backlog's drain rate is not measured yet.
        RateUnknown("rate_unknown"),
        /// The estimated wait is within the bound.
        WithinBound("within_bound"),
        /// The estimated wait exceeds the bound: 429.
        OverBound("over_bound"),
    }
    outcomes = |r| crate::decision::admit_or_refuse(r.admits())
}

impl QueueDelayReason {
    /// Whether a decision with this reason takes the prompt.
    pub fn admits(self) -> bool {
        self != QueueDelayReason::OverBound
    }

    /// The `decision` label.
    pub fn decision(self) -> &'static str {
        if self.admits() {
            "admit"
        } else {
            "refuse"
        }
    }

    /// Every (decision, reason) pair: the counter's label sets.
    pub fn pairs() -> impl Iterator<Item = (&'static str, QueueDelayReason)> {
        QueueDelayReason::ALL.into_iter().map(|r| (r.decision(), r))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueDelayDecision {
    pub admit: bool,
    pub reason: QueueDelayReason,
    /// Seconds the prompt would wait before its prefill (None: not estimated).
    pub estimated_wait_s: Option<f64>,
    /// When refused: seconds until the backlog is expected back within the
    /// bound (`Retry-After`), in [`RETRY_AFTER_MIN_S`, `RETRY_AFTER_MAX_S`].
    pub retry_after_s: u64,
}

/// Takes the prompt unless the backlog ahead of it, at the rate it drains,
/// would keep it waiting longer than the bound (module doc).
pub fn decide_queue_delay(i: &QueueDelayInputs) -> QueueDelayDecision {
    let rate = i.drain_tokens_per_s;
    let wait = (rate > 0.0 && rate.is_finite()).then(|| i.backlog_tokens as f64 / rate);
    let (reason, retry_after_s) = match (i.max_queue_delay_s, wait) {
        (None, _) => (QueueDelayReason::NoBound, 0),
        (Some(_), _) if i.backlog_tokens == 0 => (QueueDelayReason::NoBacklog, 0),
        (Some(_), None) => (QueueDelayReason::RateUnknown, 0),
        (Some(bound), Some(w)) if w <= bound => (QueueDelayReason::WithinBound, 0),
        (Some(bound), Some(w)) => {
            let retry = ((w - bound).ceil() as u64).clamp(RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S);
            (QueueDelayReason::OverBound, retry)
        }
    };
    QueueDelayDecision { admit: reason.admits(), reason, estimated_wait_s: wait, retry_after_s }
}

impl QueueDelayDecision {
    pub fn decision(&self) -> crate::decision::Decision<QueueDelayReason> {
        crate::decision::Decision::new(self.reason.decision(), self.reason)
            .term("estimated_wait_s", self.estimated_wait_s.unwrap_or(0.0))
            .term("retry_after_s", self.retry_after_s as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(bound: Option<f64>, backlog: usize, rate: f64) -> QueueDelayDecision {
        decide_queue_delay(&QueueDelayInputs { max_queue_delay_s: bound, backlog_tokens: backlog, drain_tokens_per_s: rate })
    }

    #[test]
    fn every_reason_is_reachable_and_only_over_bound_refuses() {
        let cases = [
            (decide(None, 1_000_000, 1.0), QueueDelayReason::NoBound),
            (decide(Some(30.0), 0, 0.0), QueueDelayReason::NoBacklog),
            (decide(Some(30.0), 10_000, 0.0), QueueDelayReason::RateUnknown),
            (decide(Some(30.0), 10_000, f64::NAN), QueueDelayReason::RateUnknown),
            (decide(Some(30.0), 300_000, 10_000.0), QueueDelayReason::WithinBound),
            (decide(Some(30.0), 300_001, 10_000.0), QueueDelayReason::OverBound),
        ];
        for (d, want) in cases {
            assert_eq!(d.reason, want);
            assert_eq!(d.admit, want != QueueDelayReason::OverBound);
            assert_eq!(d.retry_after_s == 0, d.admit);
        }
        let seen: std::collections::HashSet<_> = cases.iter().map(|c| c.1).collect();
        assert_eq!(seen.len(), QueueDelayReason::ALL.len());
    }

    #[test]
    fn the_wait_is_the_backlog_over_the_rate_and_retry_after_the_excess() {
        let d = decide(Some(30.0), 450_000, 10_000.0);
        assert_eq!(d.estimated_wait_s, Some(45.0));
        assert_eq!(d.retry_after_s, 15);
        assert_eq!(decide(Some(30.0), 300_100, 10_000.0).retry_after_s, RETRY_AFTER_MIN_S);
        assert_eq!(decide(Some(1.0), 100_000_000, 1.0).retry_after_s, RETRY_AFTER_MAX_S);
        // Without a bound the wait is still estimated (for the log).
        assert_eq!(decide(None, 20_000, 10_000.0).estimated_wait_s, Some(2.0));
    }

    #[test]
    fn the_labels_are_closed() {
        let pairs: Vec<_> = QueueDelayReason::pairs().map(|(d, r)| (d, r.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("admit", "no_bound"),
                ("admit", "no_backlog"),
                ("admit", "rate_unknown"),
                ("admit", "within_bound"),
                ("refuse", "over_bound")
            ]
        );
    }
}
