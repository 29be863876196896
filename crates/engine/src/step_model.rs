//! The step-time model: what a step costs, fitted on the steps this engine
//! ran, and from it the time budget (how much prefill a step may carry so
//! that it stays within `--max-step-ms`, beside its decodes or alone) and
//! the prefill rate the step-kind decision reads. The least squares are
//! in `lsq.rs`.
//!
//! A step's time is modelled as
//!
//! ```text
//! t = t0 + w * weights(T) + a * T + d * decodes + e * (decodes' contexts)
//!        + sum over prefill chunks of [ b * len * mid-chunk context + c * start ]
//! ```
//!
//! with `T` the step's tokens (decodes and prefill). `weights(T)` is the
//! share of the model's weights the step reads ([`WeightReads`]): all of a
//! dense model's, and for a mixture of experts the experts that `T` tokens
//! route to, which is nearly all of them from a few dozen tokens on. So
//! the weights are paid once per step, however its tokens split between
//! decodes and a prefill chunk; `a` is the per-token compute, `d` what a
//! decode adds (its sampling, its own attention launch), `e` per token a
//! decode attends to, `b` per prefill token and token of its context, `c`
//! per token of context a chunk reads. An additive model (a decode's cost
//! measured in decode-only steps, where it also stands for its share of
//! the weights, plus a chunk's) charges a mixed step for the weights twice
//! and plans it short of its target.
//!
//! The seven coefficients are fitted on every step by exponentially
//! weighted least squares, each step also pulling them towards the
//! previous fit, so that long stretches of one kind of step (decodes only,
//! say) do not lose what the other kind taught. All are measured on this
//! engine: the same target gives large chunks on a fast GPU and small ones
//! on a CPU, larger ones for a prompt's first chunk than deep into a long
//! context, and larger ones alone than beside many decodes. The scheduler
//! turns the seconds into chunk lengths ([`TimeBudget`]).
//!
//! Bounding every step, not only mixed ones, bounds two waits at once: an
//! answer's next token (a step) and a new prompt's first chunk (the step
//! in flight when it arrives, then its own). A step always keeps
//! [`MIN_PREFILL_TOKENS`] so that prefill never stops.

use std::time::Duration;

use kvc_policy::step_budget::{decide_step_budget, StepBudgetInputs, StepBudgetReason};
use kvc_policy::Ewma;
use kvc_scheduler::{ChunkCost, TimeBudget};

mod lsq;

use lsq::{solve_nonnegative, N};

/// Prefill tokens a step keeps even when decodes alone take the whole
/// target (at most `--max-num-batched-tokens`).
pub const MIN_PREFILL_TOKENS: usize = 256;

/// Tokens (decodes and prefill) of a step that counts towards the measured
/// prefill rate.
const MEASURED_MIN_TOKENS: usize = 64;

/// Weight each old step keeps per new one.
const KEEP: f64 = 0.95;

/// Pull towards the previous fit (in scaled units, where a step's features are ~1).
const PRIOR: f64 = 1e-3;

/// Typical magnitudes of the features, so that the normal equations are
/// well conditioned: 1, weights read, tokens, decodes, decode context
/// tokens, prefill tokens x context, chunk starts.
const SCALE: [f64; N] = [1.0, 1.0, 1e4, 64.0, 1e6, 1e9, 1e5];

/// The share of a model's weights a step of `T` tokens reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightReads {
    /// The chance that one token leaves a given expert out (0: dense).
    miss: f64,
}

impl WeightReads {
    /// Every weight, whatever the tokens.
    pub fn dense() -> Self {
        Self { miss: 0.0 }
    }

    /// A mixture of `experts` experts, `per_token` of them per token: the
    /// expected share of experts that `T` tokens reach,
    /// `1 - (1 - per_token/experts)^T`, for routing spread evenly (a
    /// skewed router reaches fewer; the fit's `w` absorbs the difference).
    pub fn routed(per_token: usize, experts: usize) -> Self {
        if experts == 0 || per_token >= experts {
            return Self::dense();
        }
        Self { miss: 1.0 - per_token as f64 / experts as f64 }
    }

    /// The share read by a step of `tokens` tokens.
    pub fn share(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        1.0 - self.miss.powi(tokens.min(i32::MAX as usize) as i32)
    }
}

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
    fn features(&self, weights: WeightReads) -> [f64; N] {
        let prefill: usize = self.prefill.iter().map(|c| c.1).sum();
        let tokens = self.decodes + prefill;
        let tok_ctx: f64 = self.prefill.iter().map(|&(s, l)| l as f64 * (s as f64 + l as f64 / 2.0)).sum();
        let starts: usize = self.prefill.iter().filter(|c| c.1 > 0).map(|c| c.0).sum();
        [1.0, weights.share(tokens), tokens as f64, self.decodes as f64, self.decode_context as f64, tok_ctx, starts as f64]
    }

    fn has_prefill(&self) -> bool {
        self.prefill.iter().any(|c| c.1 > 0)
    }
}

#[derive(Debug, Clone)]
pub struct StepModel {
    target_s: Option<f64>,
    weights: WeightReads,
    s: [[f64; N]; N],
    r: [f64; N],
    /// Coefficients in scaled units (multiply features / SCALE).
    theta: [f64; N],
    prefill_samples: usize,
    /// Tokens per second over the steps of at least [`MEASURED_MIN_TOKENS`]
    /// (the rate the disaggregation cost function reads).
    measured: Ewma,
}

impl StepModel {
    /// `max_step`: the step-time target (None: no limit); `weights`: how
    /// much of the model a step reads.
    pub fn new(max_step: Option<Duration>, weights: WeightReads) -> Self {
        Self {
            target_s: max_step.map(|d| d.as_secs_f64()),
            weights,
            s: [[0.0; N]; N],
            r: [0.0; N],
            theta: [0.0; N],
            prefill_samples: 0,
            measured: Ewma::new(),
        }
    }

    /// Records a step and its time.
    pub fn observe(&mut self, shape: &StepShape, took: Duration) {
        let tokens = shape.decodes + shape.prefill.iter().map(|c| c.1).sum::<usize>();
        if tokens >= MEASURED_MIN_TOKENS && !took.is_zero() {
            self.measured.update(tokens as f64 / took.as_secs_f64());
        }
        let raw = shape.features(self.weights);
        let x: Vec<f64> = raw.iter().zip(SCALE).map(|(v, s)| v / s).collect();
        let y = took.as_secs_f64();
        for i in 0..N {
            for j in 0..N {
                self.s[i][j] = KEEP * self.s[i][j] + x[i] * x[j];
            }
            self.r[i] = KEEP * self.r[i] + x[i] * y;
        }
        if shape.has_prefill() {
            self.prefill_samples += 1;
        }
        // The least squares (S + PRIOR I) theta = r + PRIOR theta_prev, with
        // costs that are not negative.
        let mut m = self.s;
        let mut v = self.r;
        for i in 0..N {
            m[i][i] += PRIOR;
            v[i] += PRIOR * self.theta[i];
        }
        if let Some(t) = solve_nonnegative(&m, &v) {
            self.theta = t;
        }
    }

    fn coef(&self, i: usize) -> f64 {
        self.theta[i] / SCALE[i]
    }

    /// Predicted seconds of a step.
    pub fn predict(&self, shape: &StepShape) -> f64 {
        shape.features(self.weights).iter().enumerate().map(|(i, f)| f * self.coef(i)).sum()
    }

    /// A prefill chunk's own cost: its tokens' compute and attention; the
    /// weights are the step's ([`Self::budget`]).
    fn cost(&self) -> ChunkCost {
        ChunkCost { a: self.coef(2), b: self.coef(5), c: self.coef(6) }
    }

    /// Seconds of a step with `decodes` decodes and a prefill chunk, apart
    /// from the chunk's own cost: the chunk (at least
    /// [`MIN_PREFILL_TOKENS`]) joins in reading the weights.
    fn fixed(&self, decodes: usize, decode_context: usize) -> f64 {
        self.coef(0)
            + self.coef(1) * self.weights.share(decodes + MIN_PREFILL_TOKENS)
            + (self.coef(2) + self.coef(3)) * decodes as f64
            + self.coef(4) * decode_context as f64
    }

    /// The budget for the next step, whose decodes are `decodes` with
    /// contexts summing to `decode_context`; without a target or before the
    /// fit has seen and priced prefill, none and why
    /// ([`decide_step_budget`]): then only `--max-num-batched-tokens` limits.
    pub fn budget(&self, decodes: usize, decode_context: usize) -> Result<TimeBudget, StepBudgetReason> {
        let cost = self.cost();
        let inputs = StepBudgetInputs {
            target_s: self.target_s,
            prefill_samples: self.prefill_samples,
            per_token_s: cost.a,
            per_context_token_s: cost.b,
        };
        match (decide_step_budget(&inputs), self.target_s) {
            (StepBudgetReason::Budgeted, Some(target)) => Ok(TimeBudget {
                alone_s: (target - self.fixed(0, 0)).max(0.0),
                mixed_s: (target - self.fixed(decodes, decode_context)).max(0.0),
                cost,
                min_tokens: MIN_PREFILL_TOKENS,
            }),
            (StepBudgetReason::Budgeted, None) => Err(StepBudgetReason::NoTarget),
            (reason, _) => Err(reason),
        }
    }

    /// Tokens per second measured over steps of at least
    /// [`MEASURED_MIN_TOKENS`] (0 until measured).
    pub fn measured_tokens_per_s(&self) -> f64 {
        self.measured.get()
    }

    /// Prompt tokens per second beside `decodes` decodes: the model's
    /// [`Self::mixed_prefill_tokens_per_s`], or without a budget (no target,
    /// not measured yet) the measured rate.
    pub fn prefill_tokens_per_s(&self, decodes: usize, decode_context: usize) -> f64 {
        Some(self.mixed_prefill_tokens_per_s(decodes, decode_context)).filter(|r| *r > 0.0).unwrap_or(self.measured.get())
    }

    /// Prompt tokens per second a prefill from an empty context gets beside
    /// `decodes` decodes (the mixed budget at the modelled step time); 0
    /// until measured.
    pub fn mixed_prefill_tokens_per_s(&self, decodes: usize, decode_context: usize) -> f64 {
        let Ok(b) = self.budget(decodes, decode_context) else {
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
        let mut b = StepModel::new(Some(Duration::from_millis(100)), WeightReads::routed(8, 128));
        assert_eq!(b.budget(0, 0), Err(StepBudgetReason::Unmeasured));
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
        let t = b.budget(20, 20 * 10_000).unwrap();
        let n = t.cost.tokens_within(5_000, t.mixed_s);
        let planned = StepShape { decodes: 20, decode_context: 200_000, prefill: vec![(5_000, n)] };
        assert!((truth(&planned).as_secs_f64() - 0.1).abs() < 0.005, "{:?}", truth(&planned));
    }

    #[test]
    fn decodes_only_stretches_keep_the_prefill_fit_and_no_target_means_no_budget() {
        let mut b = StepModel::new(Some(Duration::from_millis(100)), WeightReads::routed(8, 128));
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
        let mut free = StepModel::new(None, WeightReads::dense());
        free.observe(&shapes()[1], Duration::from_millis(50));
        assert_eq!(free.budget(0, 0), Err(StepBudgetReason::NoTarget));
    }

    /// Steps of a mixture of experts timed the way a GPU runs them: 3 ms
    /// fixed, 12 ms to read every expert (the share `T` tokens reach), 20 us
    /// per token, 0.5 us per decode of its own, 25 ns per token a decode
    /// attends to, prefill attention as above.
    fn moe_truth(s: &StepShape) -> Duration {
        let w = WeightReads::routed(8, 128);
        let prefill: usize = s.prefill.iter().map(|c| c.1).sum();
        let tokens = s.decodes + prefill;
        let attention: f64 = s.prefill.iter().map(|&(st, l)| 1e-9 * l as f64 * (st as f64 + l as f64 / 2.0) + 10e-9 * st as f64).sum();
        Duration::from_secs_f64(
            3e-3 + 12e-3 * w.share(tokens)
                + 20e-6 * tokens as f64
                + 0.5e-6 * s.decodes as f64
                + 25e-9 * s.decode_context as f64
                + attention,
        )
    }

    /// The weights are read once per step: a chunk beside decodes costs its
    /// tokens, not the weights again, so a mixed step planned to the target
    /// takes the target (an additive model, which learns a decode's share of
    /// the weights from decode-only steps, plans it short).
    #[test]
    fn a_mixed_step_pays_for_the_weights_once_and_fills_its_target() {
        let mut b = StepModel::new(Some(Duration::from_millis(100)), WeightReads::routed(8, 128));
        for s in shapes() {
            b.observe(&s, moe_truth(&s));
        }
        for decodes in [1, 8, 25, 64] {
            for ctx in [2_000, 20_000] {
                let t = b.budget(decodes, decodes * ctx).unwrap();
                for start in [0, 5_000, 40_000] {
                    let n = t.cost.tokens_within(start, t.mixed_s);
                    let planned = StepShape { decodes, decode_context: decodes * ctx, prefill: vec![(start, n)] };
                    let took = moe_truth(&planned).as_secs_f64();
                    assert!((took - 0.1).abs() < 0.003, "{decodes} decodes at {ctx}, chunk at {start}: {n} tokens take {took}");
                }
            }
        }
        // Alone, the same.
        let t = b.budget(0, 0).unwrap();
        let n = t.cost.tokens_within(0, t.alone_s);
        assert!((moe_truth(&StepShape { prefill: vec![(0, n)], ..Default::default() }).as_secs_f64() - 0.1).abs() < 0.003);
        // Few tokens reach few experts: decode-only steps are predicted too.
        for decodes in [1, 4, 16, 64] {
            let s = StepShape { decodes, decode_context: decodes * 8_000, prefill: vec![] };
            let (want, got) = (moe_truth(&s).as_secs_f64(), b.predict(&s));
            assert!((got - want).abs() < 0.05 * want, "{decodes} decodes: predicted {got}, took {want}");
        }
    }

    #[test]
    fn the_share_of_weights_read_grows_with_tokens_to_all_of_them() {
        let moe = WeightReads::routed(8, 128);
        assert_eq!(moe.share(0), 0.0);
        assert!((moe.share(1) - 8.0 / 128.0).abs() < 1e-12, "one token reads its own experts");
        assert!(moe.share(16) < moe.share(32) && moe.share(32) < moe.share(256));
        assert!(moe.share(256) > 0.999_999);
        assert_eq!(WeightReads::dense().share(1), 1.0);
        assert_eq!(WeightReads::routed(4, 4), WeightReads::dense());
    }

    /// The steps of a real load run on an H200 (every step's decodes,
    /// prefill tokens and chunks, and time; the contexts were not logged,
    /// so chunks count from position 0), replayed in order: each step is
    /// predicted before it is observed, as the engine plans it.
    #[test]
    fn predictions_of_a_real_h200_run_are_unbiased() {
        let text = include_str!("../tests/fixtures/h200_load70_steps.csv");
        let mut b = StepModel::new(Some(Duration::from_millis(100)), WeightReads::routed(8, 128));
        let mut errors = Vec::new();
        for (i, line) in text.lines().filter(|l| !l.starts_with('#')).enumerate() {
            let f: Vec<f64> = line.split(',').map(|v| v.parse().unwrap()).collect();
            let (decodes, tokens, chunks, took) = (f[0] as usize, f[1] as usize, f[2] as usize, f[3] / 1e3);
            let prefill = (0..chunks).map(|c| (0, tokens / chunks + usize::from(c < tokens % chunks))).collect();
            let s = StepShape { decodes, decode_context: 0, prefill };
            if i >= 100 && decodes > 0 && tokens > 0 {
                errors.push((b.predict(&s) - took) / took);
            }
            b.observe(&s, Duration::from_secs_f64(took));
        }
        errors.sort_by(f64::total_cmp);
        let q = |p: f64| errors[((errors.len() - 1) as f64 * p) as usize];
        assert!(errors.len() > 1_000);
        assert!(q(0.5).abs() < 0.05 && q(0.9) < 0.6, "mixed steps: median {:+.3}, p10 {:+.3}, p90 {:+.3}", q(0.5), q(0.1), q(0.9));
    }

    /// A machine whose prefill cost is all attention (no cost per token
    /// beside it): the non-negative fit may put the per-token coefficient at
    /// exactly 0, and the budget must still bound steps.
    #[test]
    fn a_cost_of_attention_alone_still_gives_a_budget() {
        let truth = |s: &StepShape| {
            let attention: f64 = s.prefill.iter().map(|&(st, l)| 4e-9 * l as f64 * (st as f64 + l as f64 / 2.0)).sum();
            Duration::from_secs_f64(2e-3 + 25e-9 * s.decode_context as f64 + attention)
        };
        let mut b = StepModel::new(Some(Duration::from_millis(100)), WeightReads::dense());
        for s in shapes() {
            b.observe(&s, truth(&s));
        }
        let t = b.budget(0, 0).expect("a budget");
        let n = t.cost.tokens_within(0, t.alone_s);
        let took = truth(&StepShape { prefill: vec![(0, n)], ..Default::default() }).as_secs_f64();
        assert!((took - 0.1).abs() < 0.005, "{n} tokens take {took}");
    }
}
