//! Whether a step's prefill attention over an FP8 KV cache runs cuDNN's
//! FP8 attention (e4m3 Q, K, V, softmax probabilities and O) or widens the
//! pool's K/V to bf16 for the bf16 graph, by [`decide_fp8_attention`].
//! Counted as `kvc_decisions_total{decision="fp8_attention"}`, every pair
//! of [`Fp8AttentionReason::pairs`] exported at 0.
//!
//! cuDNN's FP8 forward on Hopper aligns the causal mask top-left only, so a
//! chunk after cached context (which needs bottom-right) cannot take it;
//! it needs head dims that are multiples of 16. It pays a fixed price per
//! layer that a short prompt does not earn back, and that price depends on
//! the step: where the fresh prompts are every row of the step, Q and O
//! stay in e4m3 (RoPE writes e4m3 Q, e4m3 O goes into o_proj's FP8 GEMM)
//! and the route wins from about 2K prompt tokens (measured end to end on
//! one H100 at 32/4 heads of 128: 1.00x at 1K, 1.06x at 2K); where decode
//! rows or cached chunks share the step, Q is quantized and O widened in
//! passes of their own and the crossover lies between 2K and 4K. So the
//! route is taken from a bound per kind of step ([`Fp8AttentionBounds`];
//! `KVC_FP8_ATTENTION_MIN_TOKENS=N` sets both to N). cuDNN may still
//! refuse the graph for a shape: the model then keeps the bf16 route and
//! warns once per shape.

use crate::decision::Decision;

/// Prompt tokens in a step that mixes fresh prompts with other rows from
/// which the FP8 route is taken unless `KVC_FP8_ATTENTION_MIN_TOKENS` says
/// otherwise (measured on one H100, docs/benchmarks.md "FP8 attention from
/// a token count").
pub const DEFAULT_MIN_TOKENS: usize = 4096;

/// The same for a step of fresh prompts alone, whose Q and O stay in e4m3
/// (measured on one H100, docs/benchmarks.md "e4m3 in and out of FP8
/// attention": 1.00x at 1,024 tokens, 1.06x at 2,048).
pub const DEFAULT_WHOLE_STEP_MIN_TOKENS: usize = 2048;

/// From how many prompt tokens in a step the FP8 route is taken, per kind
/// of step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8AttentionBounds {
    /// Fresh prompts beside decode rows or cached chunks (bf16 Q in, O widened).
    pub mixed: usize,
    /// Fresh prompts that are every row of the step (e4m3 Q in and O out).
    pub whole_step: usize,
}

impl Fp8AttentionBounds {
    /// The measured defaults.
    pub const DEFAULT: Self = Self { mixed: DEFAULT_MIN_TOKENS, whole_step: DEFAULT_WHOLE_STEP_MIN_TOKENS };

    /// `n` for every kind of step (`KVC_FP8_ATTENTION_MIN_TOKENS=n`).
    pub const fn all(n: usize) -> Self {
        Self { mixed: n, whole_step: n }
    }

    /// The bound for a step that is (or is not) wholly these prompts.
    pub fn for_step(self, whole_step: bool) -> usize {
        if whole_step {
            self.whole_step
        } else {
            self.mixed
        }
    }
}

/// What the model knows when it plans a step's cuDNN attention over an FP8 pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8AttentionInputs {
    /// Prompt tokens from which the route is taken (None: off,
    /// `KVC_FP8_ATTENTION=0`).
    pub bounds: Option<Fp8AttentionBounds>,
    pub head_dim: usize,
    /// Every chunk on cuDNN starts its sequence (no cached context).
    pub fresh: bool,
    /// Those chunks are every row of the step (no decode rows or chunks on
    /// kvc's kernels beside them).
    pub whole_step: bool,
    /// Query tokens of those chunks.
    pub tokens: usize,
}

crate::decision::reasons! {
    /// The route: the `outcome` label.
    pub enum Fp8Attention {
        /// cuDNN's FP8 graph.
        Fp8("fp8"),
        /// K/V widened to bf16 for the bf16 graph.
        Bf16("bf16"),
    }
}

crate::decision::reasons! {
    /// Why [`decide_fp8_attention`] chose the route.
    pub enum Fp8AttentionReason in "fp8_attention" {
        /// Fresh prompt chunks of at least the step's bound in tokens.
        FreshPrompts("fresh_prompts"),
        /// `KVC_FP8_ATTENTION=0`.
        Off("off"),
        /// A head dim that is no multiple of 16.
        HeadDim("head_dim"),
        /// A chunk after cached context (top-left causal only on Hopper).
        CachedContext("cached_context"),
        /// Fewer prompt tokens than the step's bound: the fixed price is not earned back.
        FewTokens("few_tokens"),
    }
    outcome: Fp8Attention = |r| r.route()
}

impl Fp8AttentionReason {
    /// The route a decision with this reason takes: FP8 for fresh prompts
    /// of enough tokens, bf16 for every other reason.
    pub fn route(self) -> Fp8Attention {
        if self == Fp8AttentionReason::FreshPrompts {
            Fp8Attention::Fp8
        } else {
            Fp8Attention::Bf16
        }
    }
}

/// The route of a step's cuDNN attention over an FP8 pool (module doc).
pub fn decide_fp8_attention(i: &Fp8AttentionInputs) -> Decision<Fp8AttentionReason> {
    use Fp8AttentionReason as R;
    let min_tokens = i.bounds.map(|b| b.for_step(i.whole_step));
    let reason = match min_tokens {
        None => R::Off,
        Some(_) if !i.head_dim.is_multiple_of(16) => R::HeadDim,
        Some(_) if !i.fresh => R::CachedContext,
        Some(min) if i.tokens < min => R::FewTokens,
        Some(_) => R::FreshPrompts,
    };
    Decision::new(reason.route().as_str(), reason)
        .term("tokens", i.tokens as f64)
        .term("min_tokens", min_tokens.map_or(-1.0, |m| m as f64))
        .term("whole_step", if i.whole_step { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(min_tokens: Option<usize>, head_dim: usize, fresh: bool, tokens: usize) -> (&'static str, Fp8AttentionReason) {
        let bounds = min_tokens.map(Fp8AttentionBounds::all);
        let d = decide_fp8_attention(&Fp8AttentionInputs { bounds, head_dim, fresh, whole_step: false, tokens });
        (d.outcome, d.reason)
    }

    fn defaults(whole_step: bool, tokens: usize) -> Fp8AttentionReason {
        let i = Fp8AttentionInputs { bounds: Some(Fp8AttentionBounds::DEFAULT), head_dim: 128, fresh: true, whole_step, tokens };
        decide_fp8_attention(&i).reason
    }

    #[test]
    fn fresh_prompts_of_enough_tokens_take_the_fp8_route() {
        assert_eq!(at(Some(4096), 128, true, 4096), ("fp8", Fp8AttentionReason::FreshPrompts));
        assert_eq!(at(Some(0), 64, true, 3), ("fp8", Fp8AttentionReason::FreshPrompts));
    }

    #[test]
    fn everything_else_keeps_the_bf16_route_with_its_reason() {
        assert_eq!(at(Some(4096), 128, true, 4095), ("bf16", Fp8AttentionReason::FewTokens));
        assert_eq!(at(Some(0), 128, false, 9000), ("bf16", Fp8AttentionReason::CachedContext));
        assert_eq!(at(Some(0), 72, true, 9000), ("bf16", Fp8AttentionReason::HeadDim));
        assert_eq!(at(None, 128, true, 9000), ("bf16", Fp8AttentionReason::Off));
    }

    #[test]
    fn a_step_of_fresh_prompts_alone_takes_the_route_from_its_own_bound() {
        use Fp8AttentionReason::{FewTokens, FreshPrompts};
        let (whole, mixed) = (DEFAULT_WHOLE_STEP_MIN_TOKENS, DEFAULT_MIN_TOKENS);
        assert!(whole < mixed, "e4m3 in and out is the cheaper route");
        assert_eq!(defaults(true, whole), FreshPrompts);
        assert_eq!(defaults(true, whole - 1), FewTokens);
        assert_eq!(defaults(false, whole), FewTokens);
        assert_eq!(defaults(false, mixed), FreshPrompts);
        // An operator's bound holds for both kinds of step.
        let i = |whole_step| Fp8AttentionInputs {
            bounds: Some(Fp8AttentionBounds::all(8192)),
            head_dim: 128,
            fresh: true,
            whole_step,
            tokens: 4096,
        };
        assert_eq!(decide_fp8_attention(&i(true)).reason, FewTokens);
        assert_eq!(decide_fp8_attention(&i(false)).reason, FewTokens);
    }

    #[test]
    fn every_reason_has_one_outcome_in_its_pairs() {
        let pairs: Vec<_> = Fp8AttentionReason::pairs().collect();
        assert_eq!(pairs.len(), Fp8AttentionReason::ALL.len());
        assert!(pairs.iter().all(|(o, r)| (*o == Fp8Attention::Fp8) == (*r == Fp8AttentionReason::FreshPrompts)));
    }
}
