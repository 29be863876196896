//! Text <-> token ids, with the model's special tokens and EOS ids.
//! (stub: to be filled in)

use std::path::Path;

use crate::EngineError;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    /// Loads `tokenizer.json` (and `tokenizer_config.json` /
    /// `generation_config.json` when present) from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        let inner = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(Self { inner })
    }

    /// The real Qwen3 tokenizer shipped inside the binary.
    pub fn embedded_qwen3() -> Result<Self, EngineError> {
        todo!()
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EngineError> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, EngineError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Number of ids the tokenizer knows (including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// True for added special tokens such as `<|im_end|>`.
    pub fn is_special(&self, _id: u32) -> bool {
        false
    }

    /// EOS ids named by the tokenizer files (`eos_token` in
    /// tokenizer_config.json, `eos_token_id` in generation_config.json).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        Vec::new()
    }

    /// The `chat_template` from tokenizer_config.json (or chat_template.jinja).
    pub fn chat_template_source(&self) -> Option<&str> {
        None
    }
}
