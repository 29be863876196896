//! Whether a step's prefill attention over an FP8 KV cache runs cuDNN's
//! FP8 attention (e4m3 Q, K, V, softmax probabilities and O) or widens the
//! pool's K/V to bf16 for the bf16 graph, by [`decide_fp8_attention`].
//! Counted as `kvc_decisions_total{decision="fp8_attention"}`, every pair
//! of [`Fp8AttentionReason::pairs`] exported at 0.
//!
//! cuDNN's FP8 forward on Hopper aligns the causal mask top-left only, so a
//! chunk after cached context (which needs bottom-right) cannot take it;
//! it needs head dims that are multiples of 16. It pays a fixed price per
//! layer (Q quantized, V's amax, O's scale) that a short prompt does not
//! earn back: measured on one H100 at 32/4 heads of 128, the FP8 route
//! loses below a few thousand prompt tokens in the step, so it is taken
//! from `min_tokens` (`KVC_FP8_ATTENTION_MIN_TOKENS`). cuDNN may still
//! refuse the graph for a shape: the model then keeps the bf16 route and
//! warns once per shape.

use crate::decision::Decision;

/// Prompt tokens in a step from which the FP8 route is taken unless
/// `KVC_FP8_ATTENTION_MIN_TOKENS` says otherwise (measured on one H100,
/// docs/benchmarks.md "FP8 attention from a token count").
pub const DEFAULT_MIN_TOKENS: usize = 4096;

/// What the model knows when it plans a step's cuDNN attention over an FP8 pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8AttentionInputs {
    /// Prompt tokens from which the route is taken (None: off,
    /// `KVC_FP8_ATTENTION=0`).
    pub min_tokens: Option<usize>,
    pub head_dim: usize,
    /// Every chunk on cuDNN starts its sequence (no cached context).
    pub fresh: bool,
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
        /// Fresh prompt chunks of at least `min_tokens` tokens.
        FreshPrompts("fresh_prompts"),
        /// `KVC_FP8_ATTENTION=0`.
        Off("off"),
        /// A head dim that is no multiple of 16.
        HeadDim("head_dim"),
        /// A chunk after cached context (top-left causal only on Hopper).
        CachedContext("cached_context"),
        /// Fewer prompt tokens than `min_tokens`: the fixed price is not earned back.
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
    let reason = match i.min_tokens {
        None => R::Off,
        Some(_) if i.head_dim % 16 != 0 => R::HeadDim,
        Some(_) if !i.fresh => R::CachedContext,
        Some(min) if i.tokens < min => R::FewTokens,
        Some(_) => R::FreshPrompts,
    };
    Decision::new(reason.route().as_str(), reason)
        .term("tokens", i.tokens as f64)
        .term("min_tokens", i.min_tokens.map_or(-1.0, |m| m as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(min_tokens: Option<usize>, head_dim: usize, fresh: bool, tokens: usize) -> (&'static str, Fp8AttentionReason) {
        let d = decide_fp8_attention(&Fp8AttentionInputs { min_tokens, head_dim, fresh, tokens });
        (d.outcome, d.reason)
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
    fn every_reason_has_one_outcome_in_its_pairs() {
        let pairs: Vec<_> = Fp8AttentionReason::pairs().collect();
        assert_eq!(pairs.len(), Fp8AttentionReason::ALL.len());
        assert!(pairs.iter().all(|(o, r)| (*o == Fp8Attention::Fp8) == (*r == Fp8AttentionReason::FreshPrompts)));
    }
}
