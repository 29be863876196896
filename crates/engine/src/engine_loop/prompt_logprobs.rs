//! Prompt logprobs (vLLM's `prompt_logprobs`): the logprob of every prompt
//! token after the first under the model, with its top alternatives: what
//! scoring needs (`echo` with `logprobs` on /v1/completions, lm-eval's
//! loglikelihood).
//!
//! The logits of prompt position `p` score token `p + 1`, so a chunk over
//! positions `[start, start + len)` adds a logits row for each position
//! `p` with `next - 1 <= p < prompt_len - 1` (`next`: the first prompt
//! token not scored yet), whichever chunk of a chunked prefill it falls in.
//! A step with such rows runs the model up to its final hidden states and
//! projects them through the LM head [`SCORE_SLICE_ROWS`] rows at a time,
//! each row reduced at once to what the response needs (the token's
//! logprob and the top-k): memory stays bounded whatever the chunk, never
//! a `[chunk, vocab]` tensor, let alone a `[prompt, vocab]` one. The rows
//! are sent as [`crate::StreamEvent::PromptLogprobs`] with their step,
//! before the request's first token.
//!
//! **The prefix cache** ([`reuse_limit`]): cached KV comes without logits,
//! so a request still owed prompt logprobs reuses no cached or session KV
//! past the first position it must score (at its first admission: none).
//! vLLM decides the same way (prompt-logprobs requests skip prefix-cache
//! hits). Its own blocks are still offered to the prefix index and its
//! session turn still commits, so later requests reuse what it computed; a
//! request preempted after its prompt was scored reuses like any other.

use std::ops::Range;

use candle_core::Tensor;
use kvc_model_qwen3::Qwen3Model;
use kvc_scheduler::SeqId;
use rayon::prelude::*;

use crate::sampler::logprobs_of;
use crate::{EngineError, Logprobs};

/// Logits rows projected together: 64 x 151,936 f32 (Qwen3) is 39 MB.
pub(crate) const SCORE_SLICE_ROWS: usize = 64;

/// A request's prompt scoring in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PromptScoring {
    /// Alternatives per token.
    pub top: usize,
    /// The first prompt token whose logprob has not been sent (>= 1: the
    /// first token has none).
    pub next: usize,
}

impl PromptScoring {
    pub fn new(top: usize) -> Self {
        Self { top, next: 1 }
    }

    /// Positions of the chunk `[start, start + len)` whose logits score a
    /// prompt token not scored yet.
    pub fn positions(&self, start: usize, len: usize, prompt_len: usize) -> Range<usize> {
        let lo = start.max(self.next - 1);
        let hi = (start + len).min(prompt_len.saturating_sub(1));
        lo..hi.max(lo)
    }

    /// Every prompt token's logprob has been sent.
    pub fn done(&self, prompt_len: usize) -> bool {
        self.next >= prompt_len
    }
}

/// How many leading prompt tokens of cached KV (prefix index, session,
/// snapshot) a request may reuse, and why.
pub(crate) fn reuse_limit(scoring: Option<&PromptScoring>, prompt_len: usize) -> (usize, &'static str) {
    match scoring {
        None => (usize::MAX, "no prompt logprobs asked"),
        Some(s) if s.done(prompt_len) => (usize::MAX, "prompt logprobs already sent"),
        Some(s) => (s.next - 1, "prompt logprobs still owed: cached KV has no logits, so none is reused from the first position to score"),
    }
}

/// What one logits row of a step is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowUse {
    /// The next token of a sequence is drawn from it (the whole row).
    Sample,
    /// It scores prompt token `target` of `seq`.
    Score { seq: SeqId, target: u32, top: usize },
}

/// A step's logits as the loop uses them.
#[derive(Debug, Default)]
pub(crate) struct StepLogits {
    /// Whole rows of the sampled sequences, in chunk order.
    pub sampled: Vec<Vec<f32>>,
    /// Each scoring sequence's new prompt logprobs, in prompt order.
    pub prompt: Vec<(SeqId, Vec<Logprobs>)>,
}

enum Reduced {
    Sample(Vec<f32>),
    Score(SeqId, Logprobs),
}

/// Projects `hidden` (`[rows, hidden]`, one row per `uses` entry) through
/// the LM head a slice at a time and reduces each scored row to its
/// logprobs.
pub(crate) fn reduce_rows(model: &Qwen3Model, hidden: &Tensor, uses: &[RowUse]) -> Result<StepLogits, EngineError> {
    let mut out = StepLogits::default();
    let model_err = |e: kvc_model_qwen3::ModelError| EngineError::Model(e.to_string());
    for (i, slice) in uses.chunks(SCORE_SLICE_ROWS).enumerate() {
        let rows = hidden.narrow(0, i * SCORE_SLICE_ROWS, slice.len())?;
        let logits = model.project_logits(&rows).map_err(model_err)?.to_vec2::<f32>()?;
        let reduced: Vec<Reduced> = logits
            .into_par_iter()
            .zip(slice.par_iter())
            .map(|(row, u)| match *u {
                RowUse::Sample => Reduced::Sample(row),
                RowUse::Score { seq, target, top } => Reduced::Score(seq, logprobs_of(&row, target, top)),
            })
            .collect();
        for r in reduced {
            match r {
                Reduced::Sample(row) => out.sampled.push(row),
                Reduced::Score(seq, lp) => match out.prompt.last_mut() {
                    Some((last, lps)) if *last == seq => lps.push(lp),
                    _ => out.prompt.push((seq, vec![lp])),
                },
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_score_each_prompt_position_once_across_chunked_prefill_and_recompute() {
        let mut s = PromptScoring::new(0);
        let prompt_len = 10;
        // Chunks of 4: positions 0..4 score tokens 1..5, and so on; the last
        // position (9) samples, it scores nothing.
        assert_eq!(s.positions(0, 4, prompt_len), 0..4);
        s.next = 5;
        assert_eq!(s.positions(4, 4, prompt_len), 4..8);
        s.next = 9;
        assert_eq!(s.positions(8, 2, prompt_len), 8..9);
        s.next = 10;
        assert!(s.done(prompt_len));
        assert!(s.positions(8, 2, prompt_len).is_empty());
        // Preempted after token 5 was scored: the recompute from 0 scores
        // from position 5 on.
        let s = PromptScoring { top: 0, next: 6 };
        assert!(s.positions(0, 4, prompt_len).is_empty());
        assert_eq!(s.positions(4, 4, prompt_len), 5..8);
        // Decodes after the prompt (position >= prompt_len) score nothing.
        assert!(PromptScoring::new(0).positions(12, 1, prompt_len).is_empty());
        // A one-token prompt has nothing to score.
        assert!(PromptScoring::new(0).positions(0, 1, 1).is_empty());
    }

    #[test]
    fn reuse_stops_before_the_first_position_to_score() {
        assert_eq!(reuse_limit(None, 10).0, usize::MAX);
        assert_eq!(reuse_limit(Some(&PromptScoring::new(1)), 10).0, 0);
        assert_eq!(reuse_limit(Some(&PromptScoring { top: 1, next: 7 }), 10).0, 6);
        assert_eq!(reuse_limit(Some(&PromptScoring { top: 1, next: 10 }), 10).0, usize::MAX);
    }
}
