//! The engine's watchdog. A step in which requests wait and nothing is
//! scheduled (nothing computed, no restore being copied in) is a stall:
//! counted by the reason the queue's head waits
//! (`kvc_engine_stalled_steps_total{reason}`), warned about at most every
//! [`WARN_EVERY`] with the pool's state, and published (`stalled_since`),
//! so that `/health` can say so. The scheduler's liveness rules leave one
//! cause: KV held outside its reach (transfers in flight) in the way of the
//! oldest request; the loop then sleeps on its commands (a transfer's end
//! is one) instead of spinning.

use std::time::{Duration, Instant};

use kvc_scheduler::AdmitReason;

use crate::EngineStats;

/// Least time between two stall warnings.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(10);

/// The reasons a stall is counted under: the scheduler's, and `unknown`
/// (nothing was held back at admission, yet nothing ran).
pub fn stall_reasons() -> impl Iterator<Item = &'static str> {
    AdmitReason::ALL.into_iter().map(AdmitReason::as_str).chain(["unknown"])
}

/// What a stall warning reports besides the reason.
pub(super) struct PoolState {
    pub free: usize,
    pub evictable: usize,
    pub total: usize,
    pub waiting: usize,
    pub running: usize,
    /// Blocks held for transfers (reservations and leases) and by the role's parts.
    pub held_outside: usize,
    pub oldest_wait: Option<Duration>,
}

#[derive(Default)]
pub(super) struct Watchdog {
    last_warn: Option<Instant>,
    /// Stalled steps since the last warning.
    unwarned: u64,
}

impl Watchdog {
    /// Whether a stall now would be warned about (the caller then
    /// gathers the [`PoolState`]).
    pub(super) fn warn_due(&self) -> bool {
        self.last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY)
    }

    /// Records a stalled step, and warns with `pool` when given.
    pub(super) fn stalled(&mut self, reason: Option<AdmitReason>, pool: Option<PoolState>, stats: &mut EngineStats) {
        let reason = reason.map_or("unknown", AdmitReason::as_str);
        match stats.stalled_steps.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => stats.stalled_steps.push((reason, 1)),
        }
        let now = Instant::now();
        stats.stalled_since.get_or_insert(now);
        self.unwarned += 1;
        if let Some(p) = pool {
            tracing::warn!(
                event = "engine_stalled",
                reason,
                stalled_steps = self.unwarned,
                stalled_s = stats.stalled_since.map_or(0.0, |t| now.duration_since(t).as_secs_f64()),
                waiting = p.waiting,
                running = p.running,
                free_blocks = p.free,
                evictable_blocks = p.evictable,
                total_blocks = p.total,
                held_outside_blocks = p.held_outside,
                oldest_wait_s = p.oldest_wait.map_or(0.0, |d| d.as_secs_f64()),
                "requests are waiting and nothing could be scheduled"
            );
            self.last_warn = Some(now);
            self.unwarned = 0;
        }
    }

    /// A step computed something (or nothing waits): the stall, if any, is over.
    pub(super) fn progressed(&mut self, stats: &mut EngineStats) {
        if let Some(since) = stats.stalled_since.take() {
            tracing::info!(event = "engine_stall_ended", stalled_s = since.elapsed().as_secs_f64(), "the engine is stepping again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> PoolState {
        PoolState { free: 0, evictable: 3, total: 8, waiting: 2, running: 0, held_outside: 5, oldest_wait: None }
    }

    #[test]
    fn stalled_steps_are_counted_by_reason_and_published_until_a_step_runs() {
        let mut w = Watchdog::default();
        let mut stats = EngineStats::default();
        assert!(w.warn_due(), "the first stall is warned about");
        w.stalled(Some(AdmitReason::KvWatermark), Some(pool()), &mut stats);
        assert!(!w.warn_due(), "then at most every {WARN_EVERY:?}");
        let since = stats.stalled_since.expect("a stall is published");
        w.stalled(Some(AdmitReason::KvWatermark), None, &mut stats);
        w.stalled(None, None, &mut stats);
        assert_eq!(stats.stalled_steps, vec![("kv_watermark", 2), ("unknown", 1)]);
        assert_eq!(stats.stalled_since, Some(since), "the stall began at its first step");
        w.progressed(&mut stats);
        assert_eq!(stats.stalled_since, None);
        assert_eq!(stats.stalled_steps.iter().map(|(_, n)| n).sum::<u64>(), 3, "the counts stay");
        assert!(stall_reasons().any(|r| r == "unknown") && stall_reasons().any(|r| r == "kv_watermark"));
    }
}
