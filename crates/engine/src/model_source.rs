//! Resolves a ModelSource into weights, tokenizer and template. (stub)
use crate::{chat_template::ChatTemplate, tokenizer::TextTokenizer, EngineConfig, EngineError};

pub(crate) struct Loaded {
    pub model: (),
    pub pool: (),
    pub tokenizer: TextTokenizer,
    pub template: Option<ChatTemplate>,
    pub eos_token_ids: Vec<u32>,
    pub vocab_size: usize,
    pub served_name: String,
}

pub(crate) fn load(_config: &EngineConfig) -> Result<Loaded, EngineError> {
    todo!()
}
