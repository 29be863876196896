//! The model's own chat template, rendered with minijinja.
//! (stub: to be filled in)

use serde_json::{Map, Value};

use crate::EngineError;

pub struct ChatTemplate {
    source: String,
}

impl ChatTemplate {
    pub fn new(source: &str) -> Result<Self, EngineError> {
        Ok(Self { source: source.to_string() })
    }

    /// Renders `messages` (OpenAI-shaped JSON array) with optional `tools`
    /// (OpenAI-shaped JSON array), `add_generation_prompt`, and extra
    /// template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub fn render(
        &self,
        _messages: &Value,
        _tools: Option<&Value>,
        _add_generation_prompt: bool,
        _kwargs: &Map<String, Value>,
    ) -> Result<String, EngineError> {
        let _ = &self.source;
        todo!()
    }
}
