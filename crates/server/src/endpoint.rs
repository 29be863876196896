//! The shape shared by chat and completions answers: an endpoint turns
//! each choice's engine events into OpenAI deltas (chunk choices), which a
//! stream sends as chunks ([`crate::sse`]) and a whole answer folds
//! ([`crate::response::collect`]).

use kvc_engine::{FinishReason, Logprobs, MatchedStop, Usage};
use serde::Serialize;

use crate::openai_types::{AnswerHead, Chunk, ChunkUsage, KvcInfo};

pub trait Endpoint: Send + 'static {
    /// One chunk choice (`{index, delta | text, logprobs, finish_reason}`).
    type Delta: Serialize + Send + 'static;
    type Body: Serialize;

    /// Deltas before any token (chat's role, an echoed prompt).
    fn start(&mut self, index: usize) -> Vec<Self::Delta>;
    /// Some of the prompt's logprobs arrived (requests that ask for them);
    /// deltas to send now.
    fn prompt_logprobs(&mut self, _index: usize, _logprobs: &[Logprobs]) -> Vec<Self::Delta> {
        Vec::new()
    }
    /// A token arrived; `None` while there is nothing to say yet.
    fn token(&mut self, index: usize, token_id: u32, text: &str, logprobs: Option<&Logprobs>) -> Option<Self::Delta>;
    /// The choice ended; the last deltas and the `finish_reason` reported.
    fn finish(&mut self, index: usize, text: &str, reason: FinishReason, stop: Option<MatchedStop>) -> (Vec<Self::Delta>, &'static str);
    /// The answer's head (id, object, model, ...), which every chunk carries.
    fn head(&self) -> &AnswerHead;
    /// A streaming chunk holding `deltas`.
    fn chunk(&self, deltas: Vec<Self::Delta>, usage: ChunkUsage, kvc: Option<KvcInfo>) -> Chunk<Self::Delta> {
        Chunk { head: self.head().clone(), choices: deltas, usage, kvc }
    }
    /// The whole answer from every choice's deltas.
    fn body(&self, choices: Vec<Vec<Self::Delta>>, usage: Usage) -> Self::Body;
}
