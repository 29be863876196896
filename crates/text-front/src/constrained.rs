//! One request's grammar as generation goes: which tokens may come next
//! (the mask the sampler applies) and the token that came.
//!
//! Reasoning models answer after a `<think>...</think>` block. Like vLLM
//! with a reasoning parser on, the grammar constrains the answer, not the
//! reasoning ([`ReasoningGate`]):
//! - `Off`: the grammar applies from the first token.
//! - `MayOpen` (the prompt left the turn open, as Qwen3's template does
//!   with thinking on): the first token is the grammar's or `<think>`; after
//!   `<think>` the output is free until `</think>`, then the grammar applies.
//! - `Open` (the prompt opened `<think>`): free until `</think>`.
//!
//! The tokens of a prefill worker (its first token) go through
//! [`ConstraintState::advance`] on the decode worker like any other, so a
//! token that breaks the grammar is caught there.

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use crate::grammar::CompiledGrammar;
use kvc_wire::ReasoningGate;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first token: the grammar's or `<think>`.
    Undecided,
    /// Inside `<think>...</think>`: unconstrained.
    Reasoning,
    /// The grammar applies.
    Grammar,
}

/// Per-request constraint state.
pub struct ConstraintState {
    matcher: Matcher,
    phase: Phase,
    think: Option<(u32, u32)>,
}

impl ConstraintState {
    pub fn new(g: CompiledGrammar) -> Self {
        let phase = match (g.reasoning, g.think) {
            (_, None) | (ReasoningGate::Off, _) => Phase::Grammar,
            (ReasoningGate::MayOpen, _) => Phase::Undecided,
            (ReasoningGate::Open, _) => Phase::Reasoning,
        };
        Self { matcher: g.matcher, phase, think: g.think }
    }

    /// The tokens allowed next (`None`: any token, inside reasoning). An
    /// error means the matcher failed (it should not, on tokens it allowed).
    pub fn mask(&mut self) -> Result<Option<SimpleVob>, String> {
        match self.phase {
            Phase::Reasoning => Ok(None),
            Phase::Grammar => self.matcher.compute_mask_or_eos().map(Some).map_err(|e| e.to_string()),
            Phase::Undecided => {
                let mut m = self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
                if let Some((open, _)) = self.think {
                    if (open as usize) < m.len() {
                        m.allow_token(open);
                    }
                }
                Ok(Some(m))
            }
        }
    }

    /// Records the token that was chosen; an error if the grammar does not
    /// allow it.
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        match self.phase {
            Phase::Undecided if self.think.is_some_and(|(open, _)| open == token) => {
                self.phase = Phase::Reasoning;
                Ok(())
            }
            Phase::Reasoning => {
                if self.think.is_some_and(|(_, close)| close == token) {
                    self.phase = Phase::Grammar;
                }
                Ok(())
            }
            // Finished: only EOS was allowed (kept on with `ignore_eos`).
            Phase::Grammar if self.matcher.is_stopped() && self.matcher.get_error().is_none() => Ok(()),
            Phase::Undecided | Phase::Grammar => {
                self.phase = Phase::Grammar;
                self.matcher.consume_token(token).map_err(|e| format!("token {token} does not match the grammar: {e}"))
            }
        }
    }

    /// True once the grammar allows nothing but the end.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Grammar && self.matcher.is_stopped()
    }
}

/// Sets every logit the mask does not allow to -inf (ids past the mask's
/// end, such as a model's padded vocabulary rows, are never allowed).
pub fn apply_mask(logits: &mut [f32], allowed: &SimpleVob) {
    let words = allowed.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            continue;
        }
        for (b, x) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 || w * 32 + b >= allowed.len() {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_keeps_exactly_the_allowed_ids() {
        let mut v = SimpleVob::alloc(70);
        for t in [0u32, 31, 32, 69] {
            v.allow_token(t);
        }
        let mut l = vec![1.0f32; 80];
        apply_mask(&mut l, &v);
        let kept: Vec<usize> = l.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(i, _)| i).collect();
        assert_eq!(kept, vec![0, 31, 32, 69]);
    }
}
