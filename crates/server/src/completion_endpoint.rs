//! `text_completion` deltas of `POST /v1/completions`: one choice per
//! engine sequence (`best_of` of them per prompt), the echoed prompt first
//! with `echo`, and with `echo` and `logprobs` the prompt's logprobs before
//! the generated tokens' (the prompt's first token has `null`, as vLLM).
//!
//! With `echo` and `logprobs` the echo waits for the prompt's logprobs: it
//! goes out with the choice's first token (or its end, with `max_tokens:
//! 0`), text and logprobs together, as vLLM streams it.
//!
//! `best_of > n` ([`CompletionEndpoint::body`]): every prompt's `best_of`
//! candidates are ranked by their mean logprob per generated token
//! (OpenAI's "highest log probability per token"), best first, and the
//! first `n` are returned, indexed `prompt * n + rank`.

use std::sync::Arc;

use kvc_engine::{FinishReason, Logprobs, MatchedStop, Usage};

use crate::endpoint::Endpoint;
use crate::logprobs::{CompletionLogprobs, HasTokenizer};
use crate::openai_types::{AnswerHead, Completion, CompletionChoice, KvcInfo};

/// A prompt as echoed: its text and its tokens.
#[derive(Debug, Clone, Default)]
pub struct EchoedPrompt {
    pub text: String,
    pub tokens: Vec<u32>,
}

/// What the response holds, request-wide.
#[derive(Debug, Clone)]
pub struct CompletionShape {
    /// Choices returned per prompt.
    pub n: usize,
    /// Sequences generated per prompt (>= n).
    pub best_of: usize,
    /// `echo`: each prompt as echoed (else empty).
    pub echo: Vec<EchoedPrompt>,
    /// The client asked for `logprobs`.
    pub logprobs: bool,
}

#[derive(Debug, Default)]
struct ChoiceState {
    /// Characters of text so far (the next generated token's `text_offset`).
    offset: usize,
    pending: CompletionLogprobs,
    /// `echo` with `logprobs`: the prompt is still to be sent.
    echo_pending: bool,
    /// Characters of the prompt's tokens so far (their `text_offset`).
    prompt_offset: usize,
    /// Generated tokens' logprobs: sum and count (`best_of`).
    logprob_sum: f64,
    generated: usize,
}

impl ChoiceState {
    /// Mean logprob per generated token (0 with none).
    fn mean_logprob(&self) -> f64 {
        if self.generated == 0 {
            0.0
        } else {
            self.logprob_sum / self.generated as f64
        }
    }
}

pub struct CompletionEndpoint {
    /// Its chunks' and its body's head (`text_completion` both).
    head: AnswerHead,
    shape: CompletionShape,
    tokens: Arc<dyn HasTokenizer>,
    choices: Vec<ChoiceState>,
}

impl CompletionEndpoint {
    /// `prompts` prompts of `shape.best_of` sequences each, answered as
    /// `model` with the engine's `system_fingerprint`.
    pub fn new(
        id: String,
        (model, system_fingerprint): (String, String),
        prompts: usize,
        shape: CompletionShape,
        tokens: Arc<dyn HasTokenizer>,
    ) -> Self {
        let choices = (0..prompts * shape.best_of)
            .map(|i| {
                let mut c = ChoiceState::default();
                if let Some(echo) = shape.echo.get(i / shape.best_of.max(1)) {
                    c.offset = echo.text.chars().count();
                    if shape.logprobs {
                        c.echo_pending = true;
                        if let Some(&first) = echo.tokens.first() {
                            c.prompt_offset = c.pending.push_unscored(tokens.tokenizer(), first, 0);
                        }
                    }
                }
                c
            })
            .collect();
        let head = AnswerHead { id, object: "text_completion", created: crate::generate::unix_now(), model, system_fingerprint };
        Self { head, shape, tokens, choices }
    }

    fn take_logprobs(&mut self, index: usize) -> Option<CompletionLogprobs> {
        let pending = std::mem::take(&mut self.choices[index].pending);
        self.shape.logprobs.then_some(pending)
    }

    /// A delta of choice `index` with `text`, preceded by the echoed prompt
    /// if that is still to be sent.
    fn delta(&mut self, index: usize, text: &str) -> CompletionChoice {
        let echo = std::mem::take(&mut self.choices[index].echo_pending);
        let mut text = text.to_string();
        if echo {
            if let Some(prompt) = self.shape.echo.get(index / self.shape.best_of) {
                text = prompt.text.clone() + &text;
            }
        }
        choice(index, text, self.take_logprobs(index))
    }

    /// Candidate `index` of prompt `p`'s ranking: which candidates are
    /// returned, in order, for each prompt.
    fn ranked(&self, prompts: usize) -> Vec<usize> {
        let (n, best_of) = (self.shape.n, self.shape.best_of);
        (0..prompts)
            .flat_map(|p| {
                let mut candidates: Vec<usize> = (p * best_of..(p + 1) * best_of).collect();
                if best_of > n {
                    candidates.sort_by(|&a, &b| self.choices[b].mean_logprob().total_cmp(&self.choices[a].mean_logprob()).then(a.cmp(&b)));
                }
                candidates.truncate(n);
                candidates
            })
            .collect()
    }
}

fn choice(index: usize, text: String, logprobs: Option<CompletionLogprobs>) -> CompletionChoice {
    CompletionChoice { index, text, logprobs, finish_reason: None, stop_reason: None }
}

impl Endpoint for CompletionEndpoint {
    type Delta = CompletionChoice;
    type Body = Completion;

    fn start(&mut self, index: usize) -> Vec<CompletionChoice> {
        if self.shape.logprobs {
            // The echo goes with the prompt's logprobs (`delta`).
            return Vec::new();
        }
        match self.shape.echo.get(index / self.shape.best_of) {
            Some(prompt) if !prompt.text.is_empty() => vec![choice(index, prompt.text.clone(), None)],
            _ => Vec::new(),
        }
    }

    fn prompt_logprobs(&mut self, index: usize, logprobs: &[Logprobs]) -> Vec<CompletionChoice> {
        if self.shape.logprobs && !self.shape.echo.is_empty() {
            let c = &mut self.choices[index];
            for lp in logprobs {
                c.prompt_offset += c.pending.push(self.tokens.tokenizer(), lp, c.prompt_offset);
            }
        }
        Vec::new()
    }

    fn token(&mut self, index: usize, _token_id: u32, text: &str, logprobs: Option<&Logprobs>) -> Option<CompletionChoice> {
        if let Some(lp) = logprobs {
            let c = &mut self.choices[index];
            c.logprob_sum += f64::from(lp.chosen.logprob);
            c.generated += 1;
            if self.shape.logprobs {
                c.offset += c.pending.push(self.tokens.tokenizer(), lp, c.offset);
            }
        }
        if text.is_empty() && !self.choices[index].echo_pending {
            return None;
        }
        Some(self.delta(index, text))
    }

    fn finish(
        &mut self,
        index: usize,
        text: &str,
        reason: FinishReason,
        stop: Option<MatchedStop>,
    ) -> (Vec<CompletionChoice>, &'static str) {
        let mut last = self.delta(index, text);
        last.finish_reason = Some(reason.as_str());
        last.stop_reason = stop;
        (vec![last], reason.as_str())
    }

    fn head(&self) -> &AnswerHead {
        &self.head
    }

    /// Every sequence's deltas folded into its choice; with `best_of > n`
    /// only each prompt's best `n`, best first. `usage` counts every
    /// sequence generated (as OpenAI bills `best_of`).
    fn body(&self, choices: Vec<Vec<CompletionChoice>>, usage: Usage) -> Completion {
        let mut whole: Vec<Option<CompletionChoice>> = choices
            .into_iter()
            .enumerate()
            .map(|(index, deltas)| {
                let mut whole = choice(index, String::new(), self.shape.logprobs.then(CompletionLogprobs::default));
                for d in deltas {
                    whole.text.push_str(&d.text);
                    if let (Some(all), Some(lp)) = (whole.logprobs.as_mut(), d.logprobs) {
                        all.extend(lp);
                    }
                    if d.finish_reason.is_some() {
                        (whole.finish_reason, whole.stop_reason) = (d.finish_reason, d.stop_reason);
                    }
                }
                Some(whole)
            })
            .collect();
        let prompts = whole.len() / self.shape.best_of.max(1);
        let returned = self
            .ranked(prompts)
            .into_iter()
            .enumerate()
            .filter_map(|(index, candidate)| {
                let mut c = whole.get_mut(candidate)?.take()?;
                c.index = index;
                Some(c)
            })
            .collect();
        self.chunk(returned, Some(Some(usage.into())), Some(KvcInfo::local(&usage)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvc_engine::TokenLogprob;
    use kvc_text_front::tokenizer::TextTokenizer;
    use serde_json::json;

    fn tok() -> Arc<TextTokenizer> {
        Arc::new(TextTokenizer::embedded_qwen3().unwrap())
    }

    fn lp(id: u32, logprob: f32) -> Logprobs {
        Logprobs { chosen: TokenLogprob { token_id: id, logprob }, top: vec![TokenLogprob { token_id: id, logprob }] }
    }

    fn shape(n: usize, best_of: usize, echo: Vec<EchoedPrompt>, logprobs: bool) -> CompletionShape {
        CompletionShape { n, best_of, echo, logprobs }
    }

    fn endpoint(prompts: usize, shape: CompletionShape, t: &Arc<TextTokenizer>) -> CompletionEndpoint {
        CompletionEndpoint::new("cmpl-x".into(), ("m".into(), "fp_t".into()), prompts, shape, t.clone())
    }

    /// An endpoint for the one prompt `text`, echoed (with the prompt's
    /// logprobs or not), and the prompt's tokens.
    fn echoing(t: &Arc<TextTokenizer>, text: &str, logprobs: bool) -> (CompletionEndpoint, Vec<u32>) {
        let tokens = t.encode(text, false).unwrap();
        let echo = EchoedPrompt { text: text.into(), tokens: tokens.clone() };
        (endpoint(1, shape(1, 1, vec![echo], logprobs), t), tokens)
    }

    /// Drives choice `index` through `ids` (each with `logprob`) and its end.
    fn run(e: &mut CompletionEndpoint, index: usize, ids: &[u32], logprob: f32) -> Vec<CompletionChoice> {
        let t = tok();
        let mut deltas = e.start(index);
        for &id in ids {
            let text = t.decode(&[id], false).unwrap();
            deltas.extend(e.token(index, id, &text, Some(&lp(id, logprob))));
        }
        deltas.extend(e.finish(index, "", FinishReason::Length, None).0);
        deltas
    }

    #[test]
    fn echo_comes_first_and_offsets_count_from_it() {
        let t = tok();
        let (mut e, _) = echoing(&t, "Say: ", false);
        let ids = t.encode("hello world", false).unwrap();
        let deltas = run(&mut e, 0, &ids, -1.0);
        assert_eq!(deltas[0].text, "Say: ");
        let usage = Usage { prompt_tokens: 3, completion_tokens: ids.len(), ..Default::default() };
        let body = serde_json::to_value(e.body(vec![deltas], usage)).unwrap();
        assert_eq!(body["choices"][0]["text"], "Say: hello world");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert!(body["choices"][0]["logprobs"].is_null());
        assert_eq!(body["usage"]["completion_tokens"], ids.len());
    }

    #[test]
    fn echo_with_logprobs_covers_the_prompt_then_the_completion() {
        let t = tok();
        let (mut e, prompt) = echoing(&t, "Say: hi", true);
        assert!(e.start(0).is_empty(), "the echo waits for the prompt's logprobs");
        // The prompt's logprobs arrive in two chunks.
        let scored: Vec<Logprobs> = prompt[1..].iter().map(|&id| lp(id, -2.0)).collect();
        assert!(e.prompt_logprobs(0, &scored[..1]).is_empty());
        assert!(e.prompt_logprobs(0, &scored[1..]).is_empty());
        let ids = t.encode(" there", false).unwrap();
        let deltas = run(&mut e, 0, &ids, -0.5);
        assert!(deltas[0].text.starts_with("Say: hi"), "echo and first token together");
        let body = serde_json::to_value(e.body(vec![deltas], Usage::default())).unwrap();
        let c = &body["choices"][0];
        assert_eq!(c["text"], "Say: hi there");
        let lps = &c["logprobs"];
        let n = prompt.len() + ids.len();
        assert_eq!(lps["tokens"].as_array().unwrap().len(), n);
        assert_eq!(lps["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect::<String>(), "Say: hi there");
        assert!(lps["token_logprobs"][0].is_null() && lps["top_logprobs"][0].is_null());
        assert_eq!(lps["token_logprobs"][1], -2.0);
        assert_eq!(lps["token_logprobs"][n - 1], -0.5);
        // Offsets run through the prompt's tokens into the completion's.
        let offsets: Vec<u64> = lps["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
        assert_eq!(offsets[0], 0);
        assert_eq!(offsets[prompt.len()], "Say: hi".len() as u64);
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    }

    #[test]
    fn max_tokens_zero_echoes_the_prompt_with_its_logprobs_at_the_end() {
        let t = tok();
        let (mut e, prompt) = echoing(&t, "a b c", true);
        let scored: Vec<Logprobs> = prompt[1..].iter().map(|&id| lp(id, -1.0)).collect();
        e.prompt_logprobs(0, &scored);
        let (deltas, reason) = e.finish(0, "", FinishReason::Length, None);
        assert_eq!(reason, "length");
        assert_eq!(deltas.len(), 1);
        let body = serde_json::to_value(e.body(vec![deltas], Usage::default())).unwrap();
        let c = &body["choices"][0];
        assert_eq!(c["text"], "a b c");
        assert_eq!(c["logprobs"]["token_logprobs"].as_array().unwrap().len(), prompt.len());
    }

    #[test]
    fn best_of_returns_the_n_best_by_mean_logprob_per_prompt() {
        let t = tok();
        // Two prompts, best_of 3, n 2; logprobs not asked for.
        let mut e = endpoint(2, shape(2, 3, vec![], false), &t);
        let a = t.encode(" a", false).unwrap()[0];
        // Prompt 0: candidate 1 is best (mean -0.1), then 2 (-0.5: two tokens), then 0.
        let seqs = [(vec![a], -3.0), (vec![a], -0.1), (vec![a, a], -0.5), (vec![a], -0.2), (vec![a], -0.3), (vec![a], -0.05)];
        let deltas: Vec<_> = seqs.iter().enumerate().map(|(i, (ids, l))| run(&mut e, i, ids, *l)).collect();
        let body = serde_json::to_value(e.body(deltas, Usage::default())).unwrap();
        let texts: Vec<(u64, String)> = body["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap().into()))
            .collect();
        assert_eq!(texts, vec![(0, " a".into()), (1, " a a".into()), (2, " a".into()), (3, " a".into())]);
        assert!(body["choices"][0]["logprobs"].is_null(), "logprobs were only used to rank");
        // Ranked: prompt 0 -> candidates 1, 2; prompt 1 -> 5, 3.
        assert_eq!(e.ranked(2), vec![1, 2, 5, 3]);
        assert_eq!(json!(e.ranked(1)), json!([1, 2]));
    }

    #[test]
    fn stream_chunks_carry_text_then_finish_reason() {
        let mut e = endpoint(1, shape(1, 1, vec![], false), &tok());
        assert!(e.start(0).is_empty());
        let delta = e.token(0, 1, "ab", None).unwrap();
        let t = serde_json::to_value(e.chunk(vec![delta], None, None)).unwrap();
        assert_eq!(t["object"], "text_completion");
        assert_eq!(t["choices"][0]["text"], "ab");
        assert!(t["choices"][0]["finish_reason"].is_null() && t["choices"][0]["logprobs"].is_null());
        assert!(t.get("usage").is_none());
        assert!(e.token(0, 2, "", None).is_none(), "held-back text sends nothing");
        let (fin, reported) = e.finish(0, "", FinishReason::Stop, Some(MatchedStop::Text("x".into())));
        let fin = serde_json::to_value(e.chunk(fin, None, None)).unwrap();
        assert_eq!((fin["choices"][0]["finish_reason"].as_str(), reported), (Some("stop"), "stop"));
        assert_eq!(fin["choices"][0]["stop_reason"], "x");
    }
}
