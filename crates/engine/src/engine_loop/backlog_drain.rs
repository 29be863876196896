//! The engine's side of the backlog's drain rate
//! ([`kvc_policy::DrainRate`], published as
//! `EngineStats::backlog_drain_tokens_per_s`): the prompt tokens that left
//! the backlog in each step over the wall time since the previous step
//! ended, while a backlog was there. Time the loop spent stalled or waiting
//! with prompts queued counts; idle time does not.

use std::time::Instant;

use kvc_policy::DrainRate;

#[derive(Debug, Default)]
pub(super) struct BacklogDrain {
    rate: DrainRate,
    /// When the previous step ended, if it left a backlog.
    backlog_since: Option<Instant>,
}

impl BacklogDrain {
    /// Records a step that began at `started` with `before` prompt tokens
    /// to compute and ended at `ended` with `after`; returns the rate.
    pub(super) fn observe(&mut self, started: Instant, ended: Instant, before: usize, after: usize) -> f64 {
        if before > 0 {
            let from = self.backlog_since.unwrap_or(started);
            self.rate.observe(before.saturating_sub(after), ended.saturating_duration_since(from).as_secs_f64());
        }
        self.backlog_since = (after > 0).then_some(ended);
        self.rate.get()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn time_with_a_backlog_counts_from_the_previous_step_and_idle_time_does_not() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        let mut d = BacklogDrain::default();
        // Idle: nothing measured, however long it lasts.
        assert_eq!(d.observe(at(0), at(1000), 0, 0), 0.0);
        // 600 tokens in a 100 ms step.
        assert!((d.observe(at(1000), at(1100), 1000, 400) - 6000.0).abs() < 1.0);
        // The loop then waited 400 ms before a step of 100 ms that drained
        // nothing: 500 ms of busy time since the last step ended count.
        let r = d.observe(at(1500), at(1600), 400, 400);
        let want = {
            let mut rate = DrainRate::new();
            rate.observe(600, 0.1);
            rate.observe(0, 0.5);
            rate.get()
        };
        assert!((r - want).abs() < 1e-9, "{r} vs {want}");
        // The backlog empties; the idle time after it does not count.
        d.observe(at(1600), at(1700), 400, 0);
        let before_idle = d.rate;
        d.observe(at(5000), at(5100), 0, 0);
        assert_eq!(d.rate, before_idle);
        // A new backlog counts from its own step's start.
        d.observe(at(9000), at(9100), 100, 0);
        let mut rate = before_idle;
        rate.observe(100, 0.1);
        assert_eq!(d.rate, rate);
    }
}
