//! How fast a worker's prefill backlog drains: prompt tokens leaving the
//! backlog (computed, or found in a cache at admission) per second of wall
//! time while a backlog was there, decodes, host work and memory waits
//! included. The rate a prompt joining the queue actually sees, unlike the
//! forward pass's own prefill rate.
//!
//! Kept as two sums that decay with the time they cover ([`TAU_S`]), so
//! the rate is tokens over seconds of the last ~`TAU_S` of busy time, not
//! a mean of per-step ratios (which a run of short decode-only steps with
//! a few prompt tokens each would drag down or up).

/// Seconds of busy time after which a sample's weight has fallen to 1/e.
pub const TAU_S: f64 = 10.0;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DrainRate {
    tokens: f64,
    seconds: f64,
}

impl DrainRate {
    pub const fn new() -> Self {
        Self { tokens: 0.0, seconds: 0.0 }
    }

    /// Folds in `seconds` of busy time in which `tokens` left the backlog.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        if !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let keep = (-seconds / TAU_S).exp();
        self.tokens = self.tokens * keep + tokens as f64;
        self.seconds = self.seconds * keep + seconds;
    }

    /// Tokens per second (0.0 until something was observed).
    pub fn get(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens / self.seconds
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_tokens_over_time_not_a_mean_of_ratios() {
        let mut r = DrainRate::new();
        assert_eq!(r.get(), 0.0);
        // One 0.1 s step of 2,000 tokens and nine 0.01 s steps of none:
        // 2,000 tokens in 0.19 s, not the mean ratio 2,000 tok/s.
        r.observe(2000, 0.1);
        for _ in 0..9 {
            r.observe(0, 0.01);
        }
        let exact = 2000.0 / 0.19;
        assert!((r.get() - exact).abs() / exact < 0.02, "{} vs {exact}", r.get());
    }

    #[test]
    fn old_busy_time_fades_and_bad_intervals_are_ignored() {
        let mut r = DrainRate::new();
        for _ in 0..100 {
            r.observe(1000, 0.1); // 10K tok/s for 10 s
        }
        for _ in 0..600 {
            r.observe(100, 0.1); // then 1K tok/s for 60 s
        }
        // What is left of the first 10 s weighs e^-6.
        assert!((r.get() - 1000.0).abs() < 30.0, "{}", r.get());
        let before = r;
        r.observe(5, 0.0);
        r.observe(5, f64::NAN);
        r.observe(5, -1.0);
        assert_eq!(r, before);
    }
}
