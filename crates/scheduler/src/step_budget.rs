//! The step-time budget the engine sets for prefill chunks: seconds a step
//! may spend on them, with decodes in it and without, and the measured
//! cost of a chunk, which grows with the context it attends to. Budgets
//! in time rather than tokens let a short prompt (cheap tokens) take a
//! large chunk in the same step where a long prompt deep into its context
//! (dear tokens) takes a small one.

/// Seconds a prefill chunk takes: per token, `a + b * context`, the
/// context being the tokens before the chunk's middle; plus, per chunk,
/// `c * start` (reading the context it attends to, whatever its length).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChunkCost {
    pub a: f64,
    pub b: f64,
    pub c: f64,
}

impl ChunkCost {
    pub fn seconds(&self, start: usize, len: usize) -> f64 {
        if len == 0 {
            return 0.0;
        }
        self.c * start as f64 + len as f64 * (self.a + self.b * (start as f64 + len as f64 / 2.0))
    }

    /// Most tokens from `start` whose chunk fits in `seconds`.
    pub fn tokens_within(&self, start: usize, seconds: f64) -> usize {
        if seconds <= 0.0 {
            return 0;
        }
        if seconds.is_infinite() {
            return usize::MAX;
        }
        let seconds = seconds - self.c * start as f64;
        if seconds <= 0.0 {
            return 0;
        }
        // (b / 2) n^2 + (a + b s) n - seconds <= 0.
        let lin = self.a + self.b * start as f64;
        let n = if self.b > 0.0 {
            (-lin + (lin * lin + 2.0 * self.b * seconds).sqrt()) / self.b
        } else if lin > 0.0 {
            seconds / lin
        } else {
            return usize::MAX;
        };
        if n.is_finite() {
            n.max(0.0).min(usize::MAX as f64 / 2.0) as usize
        } else {
            usize::MAX
        }
    }
}

/// Seconds of prefill a step may carry beside decodes (`mixed_s`) and
/// alone (`alone_s`), at `cost`; a step keeps at least `min_tokens` prefill
/// tokens whatever the time says, so prefill never stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeBudget {
    pub alone_s: f64,
    pub mixed_s: f64,
    pub cost: ChunkCost,
    pub min_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_within_inverts_seconds() {
        for cost in [ChunkCost { a: 3e-5, b: 1e-9, c: 0.0 }, ChunkCost { a: 1e-4, b: 0.0, c: 0.0 }, ChunkCost { a: 3e-5, b: 1e-9, c: 4e-8 }]
        {
            for start in [0, 1_000, 50_000] {
                for secs in [0.01, 0.1, 1.0] {
                    let n = cost.tokens_within(start, secs);
                    if n == 0 {
                        assert!(cost.seconds(start, 1) > secs);
                        continue;
                    }
                    assert!(cost.seconds(start, n) <= secs + 1e-12, "{cost:?} {start} {secs} -> {n}");
                    assert!(cost.seconds(start, n + 1) > secs, "{cost:?} {start} {secs} -> {n} is not the most");
                }
            }
        }
        // Deeper context, fewer tokens in the same time.
        let c = ChunkCost { a: 3e-5, b: 1e-9, c: 0.0 };
        assert!(c.tokens_within(60_000, 0.1) < c.tokens_within(0, 0.1));
        assert_eq!(c.tokens_within(0, 0.0), 0);
    }
}
