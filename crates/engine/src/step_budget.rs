//! The step-time budget: how much prefill a step may carry so that it
//! stays within `--max-step-ms`, beside its decodes or alone.
//!
//! A step's time is modelled as
//!
//! ```text
//! t = t0 + d * decodes + e * (decodes' contexts)
//!        + sum over prefill chunks of [ len * (a + b * mid-chunk context) + c * start ]
//! ```
//!
//! (fixed cost per step; per decode and per token a decode attends to; per
//! prefill token, growing with its context; per chunk, reading the context
//! it attends to). The six coefficients are fitted on every step by
//! exponentially weighted least squares, each step also pulling them
//! towards the previous fit, so that long stretches of one kind of step
//! (decodes only, say) do not lose what the other kind taught. All are
//! measured on this engine: the same target gives large chunks on a fast
//! GPU and small ones on a CPU, larger ones for a prompt's first chunk
//! than deep into a long context, and larger ones alone than beside many
//! decodes. The scheduler turns the seconds into chunk lengths
//! ([`TimeBudget`]).
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

/// Steps with prefill seen before the fit is trusted.
const MIN_PREFILL_SAMPLES: usize = 2;

/// Weight each old step keeps per new one.
const KEEP: f64 = 0.95;

/// Pull towards the previous fit (in scaled units, where a step's features are ~1).
const PRIOR: f64 = 1e-3;

const N: usize = 6;

/// Typical magnitudes of the features, so that the normal equations are
/// well conditioned: 1, decodes, decode context tokens, prefill tokens,
/// prefill tokens x context, chunk starts.
const SCALE: [f64; N] = [1.0, 64.0, 1e6, 1e4, 1e9, 1e5];

/// What a step did, as the model sees it.
#[derive(Debug, Clone, Default)]
pub struct StepShape {
    pub decodes: usize,
    /// Sum of the decoding sequences' context lengths.
    pub decode_context: usize,
    /// Prefill chunks as (start, len).
    pub prefill: Vec<(usize, usize)>,
}

impl StepShape {
    fn features(&self) -> [f64; N] {
        let tokens: usize = self.prefill.iter().map(|c| c.1).sum();
        let tok_ctx: f64 = self.prefill.iter().map(|&(s, l)| l as f64 * (s as f64 + l as f64 / 2.0)).sum();
        let starts: usize = self.prefill.iter().filter(|c| c.1 > 0).map(|c| c.0).sum();
        [1.0, self.decodes as f64, self.decode_context as f64, tokens as f64, tok_ctx, starts as f64]
    }
}

#[derive(Debug, Clone)]
pub struct StepBudget {
    target_s: Option<f64>,
    s: [[f64; N]; N],
    r: [f64; N],
    /// Coefficients in scaled units (multiply features / SCALE).
    theta: [f64; N],
    prefill_samples: usize,
}

impl StepBudget {
    /// `max_step`: the step-time target (None: no limit).
    pub fn new(max_step: Option<Duration>) -> Self {
        Self { target_s: max_step.map(|d| d.as_secs_f64()), s: [[0.0; N]; N], r: [0.0; N], theta: [0.0; N], prefill_samples: 0 }
    }

    /// Records a step and its time.
    pub fn observe(&mut self, shape: &StepShape, took: Duration) {
        let raw = shape.features();
        let x: Vec<f64> = raw.iter().zip(SCALE).map(|(v, s)| v / s).collect();
        let y = took.as_secs_f64();
        for i in 0..N {
            for j in 0..N {
                self.s[i][j] = KEEP * self.s[i][j] + x[i] * x[j];
            }
            self.r[i] = KEEP * self.r[i] + x[i] * y;
        }
        if raw[3] > 0.0 {
            self.prefill_samples += 1;
        }
        // Solve (S + PRIOR I) theta = r + PRIOR theta_prev; costs are not negative.
        let mut m = self.s;
        let mut v = self.r;
        for i in 0..N {
            m[i][i] += PRIOR;
            v[i] += PRIOR * self.theta[i];
        }
        if let Some(t) = solve(m, v) {
            self.theta = t.map(|c| c.max(0.0));
        }
    }

    fn coef(&self, i: usize) -> f64 {
        self.theta[i] / SCALE[i]
    }

    /// Predicted seconds of a step.
    pub fn predict(&self, shape: &StepShape) -> f64 {
        shape.features().iter().enumerate().map(|(i, f)| f * self.coef(i)).sum()
    }

    fn cost(&self) -> ChunkCost {
        ChunkCost { a: self.coef(3), b: self.coef(4), c: self.coef(5) }
    }

    /// The budget for the next step, whose decodes are `decodes` with
    /// contexts summing to `decode_context`: None without a target or
    /// before the fit has seen prefill (then only `--max-num-batched-tokens`
    /// limits).
    pub fn decide(&self, decodes: usize, decode_context: usize) -> Option<TimeBudget> {
        let target = self.target_s?;
        let cost = self.cost();
        if self.prefill_samples < MIN_PREFILL_SAMPLES || cost.a <= 0.0 {
            return None;
        }
        let fixed = self.predict(&StepShape { decodes, decode_context, prefill: vec![] });
        Some(TimeBudget {
            alone_s: (target - self.coef(0)).max(0.0),
            mixed_s: (target - fixed).max(0.0),
            cost,
            min_tokens: MIN_PREFILL_TOKENS,
        })
    }

    /// Prompt tokens per second a prefill from an empty context gets beside
    /// `decodes` decodes (the mixed budget at the modelled step time); 0
    /// until measured.
    pub fn mixed_prefill_tokens_per_s(&self, decodes: usize, decode_context: usize) -> f64 {
        let Some(b) = self.decide(decodes, decode_context) else {
            return 0.0;
        };
        let n = b.cost.tokens_within(0, b.mixed_s).clamp(b.min_tokens, 1 << 20);
        let t = self.predict(&StepShape { decodes, decode_context, prefill: vec![(0, n)] });
        if t > 0.0 {
            n as f64 / t
        } else {
            0.0
        }
    }
}

/// Gaussian elimination with partial pivoting; None when singular.
fn solve(mut m: [[f64; N]; N], mut v: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let p = (col..N).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[p][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, p);
        v.swap(col, p);
        let pivot = m[col];
        for row in col + 1..N {
            let f = m[row][col] / pivot[col];
            for (x, p) in m[row].iter_mut().zip(pivot).skip(col) {
                *x -= f * p;
            }
            v[row] -= f * v[col];
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        let s: f64 = (row + 1..N).map(|k| m[row][k] * x[k]).sum();
        x[row] = (v[row] - s) / m[row][row];
    }
    x.iter().all(|c| c.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps timed by a known model: 2 ms fixed, 0.3 ms per decode, 20 ns
    /// per decode context token, 30 us per prefill token plus 1 ns per
    /// token of its context, 10 ns per token of a chunk's start.
    fn truth(s: &StepShape) -> Duration {
        let prefill: f64 =
            s.prefill.iter().map(|&(st, l)| l as f64 * (30e-6 + 1e-9 * (st as f64 + l as f64 / 2.0)) + 10e-9 * st as f64).sum();
        Duration::from_secs_f64(2e-3 + 0.3e-3 * s.decodes as f64 + 20e-9 * s.decode_context as f64 + prefill)
    }

    fn shapes() -> Vec<StepShape> {
        let mut out = Vec::new();
        for i in 0..200usize {
            let decodes = (i * 7) % 40;
            let prefill = match i % 4 {
                0 => vec![],
                1 => vec![(0, 512 + i * 13 % 3000)],
                2 => vec![((i * 997) % 60_000, 256 + i * 31 % 2000)],
                _ => vec![(0, 300), ((i * 577) % 30_000, 1000)],
            };
            out.push(StepShape { decodes, decode_context: decodes * (1000 + (i * 113) % 20_000), prefill });
        }
        out
    }

    #[test]
    fn the_fit_predicts_steps_it_has_not_seen() {
        let mut b = StepBudget::new(Some(Duration::from_millis(100)));
        assert_eq!(b.decide(0, 0), None, "unmeasured");
        for s in shapes() {
            b.observe(&s, truth(&s));
        }
        for s in [
            StepShape { decodes: 64, decode_context: 64 * 30_000, prefill: vec![(90_000, 700)] },
            StepShape { decodes: 0, decode_context: 0, prefill: vec![(0, 8192)] },
            StepShape { decodes: 8, decode_context: 8_000, prefill: vec![] },
        ] {
            let (want, got) = (truth(&s).as_secs_f64(), b.predict(&s));
            assert!((got - want).abs() < 0.05 * want, "{s:?}: predicted {got}, took {want}");
        }
        // The budget is what the target leaves: a mixed step planned to it
        // takes the target.
        let t = b.decide(20, 20 * 10_000).unwrap();
        let n = t.cost.tokens_within(5_000, t.mixed_s);
        let planned = StepShape { decodes: 20, decode_context: 200_000, prefill: vec![(5_000, n)] };
        assert!((truth(&planned).as_secs_f64() - 0.1).abs() < 0.005, "{:?}", truth(&planned));
    }

    #[test]
    fn decodes_only_stretches_keep_the_prefill_fit_and_no_target_means_no_budget() {
        let mut b = StepBudget::new(Some(Duration::from_millis(100)));
        for s in shapes() {
            b.observe(&s, truth(&s));
        }
        let before = b.cost();
        let decode_only = StepShape { decodes: 16, decode_context: 16 * 4_000, prefill: vec![] };
        for _ in 0..1_000 {
            b.observe(&decode_only, truth(&decode_only));
        }
        let after = b.cost();
        assert!((after.a - before.a).abs() < 0.05 * before.a, "{before:?} -> {after:?}");
        let mut free = StepBudget::new(None);
        free.observe(&shapes()[1], Duration::from_millis(50));
        assert_eq!(free.decide(0, 0), None);
    }
}
