//! The step-time budget: how much prefill a step may carry so that it
//! stays within `--max-step-ms`, beside its decodes or alone.
//!
//! Step time is modelled as `decode_s + sum over prefill chunks of
//! len * (a + b * context)`: `decode_s` is the moving average of steps
//! with decodes only; `a` and `b` (the per-token cost and its growth with
//! the context a chunk attends to) are fitted by exponentially weighted
//! least squares over steps with a sizeable prefill. All are measured on
//! this engine, so the same target gives large chunks on a fast GPU and
//! small ones on a CPU, larger ones for a prompt's first chunk than deep
//! into a long context, and larger ones alone than beside decodes. The
//! scheduler turns the seconds into chunk lengths ([`TimeBudget`]).
//!
//! Bounding every step, not only mixed ones, bounds two waits at once: an
//! answer's next token (a step) and a new prompt's first chunk (the step
//! in flight when it arrives, then its own). A step always keeps
//! [`MIN_PREFILL_TOKENS`] so that prefill never stops.

use std::time::Duration;

use kvc_scheduler::{ChunkCost, TimeBudget};

/// Prefill tokens a step keeps even when decodes alone take the whole
/// target (at most `--max-num-batched-tokens`).
pub const MIN_PREFILL_TOKENS: usize = 256;

/// Prefill tokens below which a step's time says little about the cost.
const MIN_MEASURED_PREFILL: usize = 64;

/// Weight of a new measurement in the moving averages; the fit forgets
/// old steps at the same rate.
const ALPHA: f64 = 0.2;

/// Weighted least squares of `y = a * x0 + b * x1` (x0: tokens, x1:
/// tokens times context), forgetting old samples.
#[derive(Debug, Clone, Default)]
struct CostFit {
    s00: f64,
    s01: f64,
    s11: f64,
    r0: f64,
    r1: f64,
}

impl CostFit {
    fn add(&mut self, x0: f64, x1: f64, y: f64) {
        let k = 1.0 - ALPHA;
        self.s00 = k * self.s00 + x0 * x0;
        self.s01 = k * self.s01 + x0 * x1;
        self.s11 = k * self.s11 + x1 * x1;
        self.r0 = k * self.r0 + x0 * y;
        self.r1 = k * self.r1 + x1 * y;
    }

    /// The fitted cost; `b = 0` while the contexts seen cannot tell `a`
    /// from `b` (or the fit says cost falls with context).
    fn cost(&self) -> Option<ChunkCost> {
        if self.s00 <= 0.0 {
            return None;
        }
        let det = self.s00 * self.s11 - self.s01 * self.s01;
        if det > 1e-6 * self.s00 * self.s11 {
            let a = (self.r0 * self.s11 - self.r1 * self.s01) / det;
            let b = (self.s00 * self.r1 - self.s01 * self.r0) / det;
            if a > 0.0 && b >= 0.0 {
                return Some(ChunkCost { a, b });
            }
        }
        // One parameter: the average cost per token at the contexts seen.
        let a = self.r0 / self.s00;
        (a > 0.0).then_some(ChunkCost { a, b: 0.0 })
    }
}

#[derive(Debug, Clone)]
pub struct StepBudget {
    target_s: Option<f64>,
    decode_s: Option<f64>,
    fit: CostFit,
}

impl StepBudget {
    /// `max_step`: the step-time target (None: no limit).
    pub fn new(max_step: Option<Duration>) -> Self {
        Self { target_s: max_step.map(|d| d.as_secs_f64()), decode_s: None, fit: CostFit::default() }
    }

    /// Records a step: its decodes, its prefill chunks as (start, len), and
    /// its time.
    pub fn observe(&mut self, decodes: usize, prefill: &[(usize, usize)], took: Duration) {
        let t = took.as_secs_f64();
        let tokens: usize = prefill.iter().map(|c| c.1).sum();
        if tokens == 0 && decodes > 0 {
            self.decode_s = Some(self.decode_s.map_or(t, |a| (1.0 - ALPHA) * a + ALPHA * t));
        } else if tokens >= MIN_MEASURED_PREFILL {
            let base = if decodes > 0 { self.decode_s.unwrap_or(0.0).min(t) } else { 0.0 };
            let x1: f64 = prefill.iter().map(|&(start, len)| len as f64 * (start as f64 + len as f64 / 2.0)).sum();
            self.fit.add(tokens as f64, x1, t - base);
        }
    }

    /// The budget for the next step: None without a target or before the
    /// first measurement (then only `--max-num-batched-tokens` limits).
    pub fn decide(&self) -> Option<TimeBudget> {
        let target = self.target_s?;
        let cost = self.fit.cost()?;
        Some(TimeBudget {
            alone_s: target,
            mixed_s: (target - self.decode_s.unwrap_or(0.0)).max(0.0),
            cost,
            min_tokens: MIN_PREFILL_TOKENS,
        })
    }

    /// Prompt tokens per second a prefill from an empty context gets while
    /// decodes run (the mixed budget at the modelled step time); 0 until
    /// measured.
    pub fn mixed_prefill_tokens_per_s(&self) -> f64 {
        let Some(b) = self.decide() else {
            return 0.0;
        };
        let n = b.cost.tokens_within(0, b.mixed_s).max(b.min_tokens) as f64;
        n / (self.decode_s.unwrap_or(0.0) + b.cost.seconds(0, n as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_fit_recovers_a_cost_that_grows_with_context() {
        let truth = ChunkCost { a: 3e-5, b: 2e-10 };
        let mut b = StepBudget::new(Some(MS(100)));
        assert_eq!(b.decide(), None, "unmeasured");
        b.observe(8, &[], MS(20));
        for (start, len) in [(0, 2048), (2048, 2048), (30_000, 1024), (0, 512), (60_000, 700)] {
            b.observe(0, &[(start, len)], Duration::from_secs_f64(truth.seconds(start, len)));
        }
        let got = b.decide().unwrap();
        assert!((got.cost.a - truth.a).abs() < 1e-9 && (got.cost.b - truth.b).abs() < 1e-13, "{got:?}");
        assert_eq!((got.alone_s, got.mixed_s), (0.1, 0.1 - 0.02));
        // A mixed step is fitted net of the decodes.
        b.observe(8, &[(0, 1000)], MS(20) + Duration::from_secs_f64(truth.seconds(0, 1000)));
        assert!((b.decide().unwrap().cost.a - truth.a).abs() < 1e-9);
    }

    #[test]
    fn one_context_only_gives_the_average_cost_and_no_target_no_budget() {
        let mut b = StepBudget::new(Some(MS(100)));
        b.observe(0, &[(0, 1000)], MS(50));
        b.observe(0, &[(0, 1000)], MS(50));
        let c = b.decide().unwrap().cost;
        assert!((c.a - 5e-5).abs() < 1e-12 && c.b == 0.0, "{c:?}");
        let mut free = StepBudget::new(None);
        free.observe(0, &[(0, 1000)], MS(50));
        assert_eq!(free.decide(), None);
        // Decodes slower than the target leave nothing but the floor.
        let mut slow = StepBudget::new(Some(MS(30)));
        slow.observe(64, &[], MS(40));
        slow.observe(0, &[(0, 1000)], MS(50));
        assert_eq!(slow.decide().unwrap().mixed_s, 0.0);
    }
}
