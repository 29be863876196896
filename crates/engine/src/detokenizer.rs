//! Incremental, UTF-8-safe detokenization.
//! (stub: to be filled in)

use crate::tokenizer::TextTokenizer;

/// Turns a growing list of token ids into text deltas, never emitting a
/// partial UTF-8 character.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    /// `prompt_len` tokens of `ids` are context only (their text is not emitted).
    pub fn new(skip_special_tokens: bool) -> Self {
        Self { prefix_offset: 0, read_offset: 0, skip_special_tokens }
    }

    /// Call after each new token is appended to `ids` (generated ids only);
    /// returns the text that became final.
    pub fn step(&mut self, _tokenizer: &TextTokenizer, _ids: &[u32]) -> String {
        let _ = (self.prefix_offset, self.read_offset, self.skip_special_tokens);
        todo!()
    }
}
