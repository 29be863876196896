//! The decode-latency budget: how many prefill tokens a step that also
//! runs decodes may carry, so that the step stays within `--max-step-ms`.
//!
//! Step time is modelled as `decode_s + prefill_tokens * s_per_token`:
//! `decode_s` is the moving average of steps with decodes only,
//! `s_per_token` that of `(step - decode_s) / prefill_tokens` over steps
//! with a sizeable prefill. Both are measured on this engine, so the same
//! target gives large chunks on a fast GPU and small ones on a CPU. Steps
//! with no decode are not limited (prefill alone uses the whole
//! `--max-num-batched-tokens`), and a step with decodes always keeps
//! [`MIN_MIXED_PREFILL_TOKENS`] so that prefill never stops while
//! answers stream.

use std::time::Duration;

/// Prefill tokens a mixed step keeps even when decodes alone take the
/// whole target.
pub const MIN_MIXED_PREFILL_TOKENS: usize = 256;

/// Prefill tokens below which a step's time says little about the rate.
const MIN_MEASURED_PREFILL: usize = 64;

/// Weight of a new measurement in the moving averages.
const ALPHA: f64 = 0.2;

#[derive(Debug, Clone)]
pub struct StepBudget {
    target_s: Option<f64>,
    max_tokens: usize,
    decode_s: Option<f64>,
    s_per_token: Option<f64>,
}

/// The budget for the next mixed step, and why it is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetDecision {
    pub tokens: usize,
    /// "no_target", "unmeasured", "latency_target" or "floor".
    pub reason: &'static str,
}

impl StepBudget {
    /// `max_step`: the latency target (None: no limit).
    pub fn new(max_step: Option<Duration>, max_num_batched_tokens: usize) -> Self {
        Self { target_s: max_step.map(|d| d.as_secs_f64()), max_tokens: max_num_batched_tokens, decode_s: None, s_per_token: None }
    }

    /// Records a step: its decodes, prefill tokens and time.
    pub fn observe(&mut self, decodes: usize, prefill_tokens: usize, took: Duration) {
        let t = took.as_secs_f64();
        let ewma = |avg: &mut Option<f64>, x: f64| *avg = Some(avg.map_or(x, |a| (1.0 - ALPHA) * a + ALPHA * x));
        if prefill_tokens == 0 && decodes > 0 {
            ewma(&mut self.decode_s, t);
        } else if prefill_tokens >= MIN_MEASURED_PREFILL {
            let base = if decodes > 0 { self.decode_s.unwrap_or(0.0).min(t) } else { 0.0 };
            ewma(&mut self.s_per_token, (t - base) / prefill_tokens as f64);
        }
    }

    /// Prefill tokens for the next step if it runs decodes.
    pub fn mixed_prefill_tokens(&self) -> BudgetDecision {
        let cap = |n: usize| n.clamp(MIN_MIXED_PREFILL_TOKENS.min(self.max_tokens), self.max_tokens);
        let Some(target) = self.target_s else {
            return BudgetDecision { tokens: self.max_tokens, reason: "no_target" };
        };
        let Some(per_token) = self.s_per_token.filter(|p| *p > 0.0) else {
            return BudgetDecision { tokens: self.max_tokens, reason: "unmeasured" };
        };
        let left = target - self.decode_s.unwrap_or(0.0);
        let tokens = if left > 0.0 { (left / per_token) as usize } else { 0 };
        let reason = if tokens <= MIN_MIXED_PREFILL_TOKENS { "floor" } else { "latency_target" };
        BudgetDecision { tokens: cap(tokens), reason }
    }

    /// Prompt tokens per second a prefill gets while decodes run (the
    /// mixed budget at the modelled step time); 0 until measured.
    pub fn mixed_prefill_tokens_per_s(&self) -> f64 {
        let Some(per_token) = self.s_per_token.filter(|p| *p > 0.0) else {
            return 0.0;
        };
        let n = self.mixed_prefill_tokens().tokens as f64;
        n / (self.decode_s.unwrap_or(0.0) + n * per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_budget_fills_what_decodes_leave_of_the_target() {
        let mut b = StepBudget::new(Some(MS(100)), 8192);
        assert_eq!(b.mixed_prefill_tokens(), BudgetDecision { tokens: 8192, reason: "unmeasured" });
        b.observe(8, 0, MS(20)); // decodes alone: 20 ms
        b.observe(0, 4000, MS(200)); // prefill alone: 50 us/token
                                     // (100 - 20) ms / 50 us = 1600 tokens.
        assert_eq!(b.mixed_prefill_tokens(), BudgetDecision { tokens: 1600, reason: "latency_target" });
        assert!((b.mixed_prefill_tokens_per_s() - 1600.0 / 0.1).abs() < 1.0);
        // A mixed step measures the rate net of the decodes: (70 - 20) / 1000.
        let mut m = StepBudget::new(Some(MS(100)), 8192);
        m.observe(8, 0, MS(20));
        m.observe(8, 1000, MS(70));
        assert_eq!(m.mixed_prefill_tokens().tokens, 1600);
    }

    #[test]
    fn slow_decodes_leave_the_floor_and_no_target_means_no_limit() {
        let mut b = StepBudget::new(Some(MS(30)), 8192);
        b.observe(64, 0, MS(40));
        b.observe(0, 1000, MS(50));
        assert_eq!(b.mixed_prefill_tokens(), BudgetDecision { tokens: MIN_MIXED_PREFILL_TOKENS, reason: "floor" });
        let mut free = StepBudget::new(None, 512);
        free.observe(0, 1000, MS(50));
        assert_eq!(free.mixed_prefill_tokens(), BudgetDecision { tokens: 512, reason: "no_target" });
        // The floor never exceeds the step cap.
        let small = StepBudget::new(Some(MS(1)), 100);
        assert!(small.mixed_prefill_tokens().tokens <= 100);
    }
}
