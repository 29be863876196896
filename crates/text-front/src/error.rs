//! The text front's one error type; the engine converts it into its own
//! (`kvc_engine::EngineError`), variant for variant.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TextFrontError {
    /// A request parameter is out of range; `param` names it as the OpenAI
    /// API spells it (a chat message the template cannot take).
    #[error("{message}")]
    InvalidParam { param: String, message: String },
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// What a model's text front is built from cannot be read (the
    /// grammar compiler's vocabulary, an EOS token).
    #[error("failed to load model: {0}")]
    Load(String),
    /// A structured-output grammar (JSON schema, regex, Lark) that the
    /// grammar compiler rejects.
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
}
