//! Turning a turn's [`PromptSpec`] into the prompt that goes out.
//!
//! Token-id prompts (`--api completions`) are exact: equal hash ids give
//! equal blocks, and a session's turn is its previous prompt, a stand-in
//! for its previous output, and new tokens. The stand-in is needed because
//! OpenAI endpoints stream text, not token ids, and text does not round-trip
//! to the same ids; so the server can reuse a session's previous *prompt*
//! but recomputes the tokens standing for its previous *output* (see the
//! README: reuse is under-reported by about one output length per turn).
//!
//! Chat prompts (`--api chat`) carry the same tokens as words, and a
//! session's history carries the model's real answers.

use serde::Serialize;

use super::tokens::{words, TokenSynth};
use crate::trace::{Growth, PromptSpec, Turn};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// One request's prompt: always the token ids (completions, and the
/// client's reuse bookkeeping), and chat messages when asked for.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    pub tokens: Vec<u32>,
    pub messages: Vec<Message>,
}

/// The tokens of a hash-block prompt; tokens past the last named block
/// are unique to `request`.
pub fn block_prompt(synth: &TokenSynth, hash_ids: &[u64], block_tokens: usize, len: usize, request: u64) -> Vec<u32> {
    let mut out = Vec::with_capacity(len);
    for &h in hash_ids {
        let n = block_tokens.min(len - out.len());
        if n == 0 {
            break;
        }
        synth.block(h, n, &mut out);
    }
    if out.len() < len {
        let n = len - out.len();
        synth.fresh(u64::MAX, request, 0, n, &mut out);
    }
    out
}

/// What a session has said so far.
pub struct SessionContext {
    synth: TokenSynth,
    session: u64,
    chat: bool,
    /// Previous prompt + stand-in for its output (token ids).
    context: Vec<u32>,
    messages: Vec<Message>,
}

impl SessionContext {
    /// `session` tells this session's new tokens apart from every other's.
    pub fn new(synth: TokenSynth, session: u64, chat: bool) -> Self {
        SessionContext { synth, session, chat, context: Vec::new(), messages: Vec::new() }
    }

    /// The prompt of the session's `index`-th turn (0-based position).
    pub fn prompt(&mut self, index: usize, turn: &Turn) -> Prompt {
        match &turn.prompt {
            PromptSpec::Blocks { hash_ids, block_tokens, len } => {
                let request = crate::synth::rng::mix_all(&[self.session, index as u64]);
                let tokens = block_prompt(&self.synth, hash_ids, *block_tokens, *len, request);
                let messages = if self.chat { vec![user(words(&tokens))] } else { vec![] };
                self.context = tokens.clone();
                Prompt { tokens, messages }
            }
            PromptSpec::Grow(growth) => {
                let (keep, len) = match *growth {
                    Growth::Append(n) => (self.context.len(), self.context.len() + n),
                    Growth::Input { len, keep } => (keep.unwrap_or(len).min(self.context.len()).min(len), len),
                };
                let extends = keep == self.context.len() && !self.context.is_empty();
                self.context.truncate(keep);
                let start = self.context.len();
                self.synth.fresh(self.session, index as u64, 0, len - start, &mut self.context);
                if self.chat {
                    let new = words(&self.context[start..]);
                    if extends && !self.messages.is_empty() {
                        self.messages.push(user(new));
                    } else {
                        self.messages = vec![user(words(&self.context))];
                    }
                }
                Prompt { tokens: self.context.clone(), messages: self.messages.clone() }
            }
        }
    }

    /// The turn ended: its output joins the history (the stand-in tokens of
    /// the trace's output length; in chat, the real answer text).
    pub fn finish(&mut self, index: usize, turn: &Turn, answer: &str) {
        self.synth.output_stand_in(self.session, index as u64, turn.output_tokens, &mut self.context);
        if self.chat {
            self.messages.push(Message { role: "assistant", content: answer.to_string() });
        }
    }
}

fn user(content: String) -> Message {
    Message { role: "user", content }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(prompt: PromptSpec, output_tokens: usize) -> Turn {
        Turn { turn: 0, arrival_s: 0.0, think_s: 0.0, prompt, output_tokens }
    }

    #[test]
    fn a_session_turn_extends_the_previous_prompt_and_output_stand_in() {
        let s = TokenSynth::new(3);
        let mut ctx = SessionContext::new(s, 1, false);
        let t0 = turn(PromptSpec::Grow(Growth::Input { len: 100, keep: Some(0) }), 20);
        let t1 = turn(PromptSpec::Grow(Growth::Append(30)), 5);
        let p0 = ctx.prompt(0, &t0).tokens;
        ctx.finish(0, &t0, "ignored in completions");
        let p1 = ctx.prompt(1, &t1).tokens;
        assert_eq!(p1.len(), 150);
        assert_eq!(&p1[..100], &p0[..]);
        // Another session's first turn shares nothing.
        let other = SessionContext::new(s, 2, false).prompt(0, &t0).tokens;
        assert_ne!(other[..16], p0[..16]);
    }

    #[test]
    fn compaction_keeps_the_prefix_and_replaces_the_rest() {
        let mut ctx = SessionContext::new(TokenSynth::new(0), 1, false);
        let t0 = turn(PromptSpec::Grow(Growth::Input { len: 100, keep: Some(0) }), 10);
        let p0 = ctx.prompt(0, &t0).tokens;
        ctx.finish(0, &t0, "");
        let t1 = turn(PromptSpec::Grow(Growth::Input { len: 80, keep: Some(40) }), 10);
        let p1 = ctx.prompt(1, &t1).tokens;
        assert_eq!(p1.len(), 80);
        assert_eq!(&p1[..40], &p0[..40]);
        assert_ne!(&p1[40..], &p0[40..80]);
    }

    #[test]
    fn hash_block_prompts_share_exactly_their_common_blocks() {
        let s = TokenSynth::new(0);
        let a = block_prompt(&s, &[1, 2, 3], 16, 40, 100);
        let b = block_prompt(&s, &[1, 2, 4], 16, 48, 101);
        assert_eq!((a.len(), b.len()), (40, 48));
        assert_eq!(a[..32], b[..32]);
        assert_ne!(a[32..40], b[32..40]);
        // Past the last named block, tokens are the request's own.
        let c = block_prompt(&s, &[1], 16, 20, 7);
        let d = block_prompt(&s, &[1], 16, 20, 8);
        assert_eq!(c[..16], d[..16]);
        assert_ne!(c[16..], d[16..]);
    }

    #[test]
    fn chat_history_carries_the_real_answers() {
        let mut ctx = SessionContext::new(TokenSynth::new(0), 1, true);
        let t0 = turn(PromptSpec::Grow(Growth::Input { len: 8, keep: Some(0) }), 4);
        let t1 = turn(PromptSpec::Grow(Growth::Append(4)), 4);
        assert_eq!(ctx.prompt(0, &t0).messages.len(), 1);
        ctx.finish(0, &t0, "the real answer");
        let m = ctx.prompt(1, &t1).messages;
        assert_eq!(m.iter().map(|m| m.role).collect::<Vec<_>>(), ["user", "assistant", "user"]);
        assert_eq!(m[1].content, "the real answer");
    }
}
