//! The engine crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    /// A request parameter is out of range; `param` names it as the OpenAI
    /// API spells it.
    #[error("{message}")]
    InvalidParam { param: String, message: String },
    #[error("This model's maximum context length is {max_model_len} tokens. However, you requested {requested} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion). Please reduce the length of the prompt or the completion.")]
    PromptTooLong { prompt_tokens: usize, max_tokens: usize, requested: usize, max_model_len: usize },
    #[error("token id {token} is out of range: the model's vocabulary has {vocab_size} tokens")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("model error: {0}")]
    Model(String),
    #[error("failed to load model: {0}")]
    Load(String),
    /// Fetching the model from the Hugging Face hub failed (the message
    /// says why and what to do).
    #[error("cannot get the model from the Hugging Face hub: {0}")]
    Download(String),
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// The pool cannot hold the blocks asked for right now (a reservation
    /// or a snapshot push); the caller falls back or retries later.
    #[error("no room in the KV pool: {0}")]
    NoKvRoom(String),
    /// A reservation or snapshot slot that no longer exists.
    #[error("unknown or released KV reservation {0}")]
    UnknownReservation(u64),
    /// A structured-output grammar (JSON schema, regex, Lark) that the
    /// grammar compiler rejects.
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
}

impl From<kvc_wire::ParamError> for EngineError {
    fn from(e: kvc_wire::ParamError) -> Self {
        EngineError::InvalidParam { param: e.param, message: e.message }
    }
}

impl EngineError {
    /// True for errors caused by the request (HTTP 400), false for errors of
    /// the server (HTTP 500/503).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::InvalidParam { .. }
                | EngineError::PromptTooLong { .. }
                | EngineError::TokenOutOfRange { .. }
                | EngineError::EmptyPrompt
                | EngineError::Template(_)
                | EngineError::InvalidGrammar(_)
        )
    }

    /// The OpenAI `param` field for client errors.
    pub fn param(&self) -> Option<&str> {
        match self {
            EngineError::InvalidParam { param, .. } => Some(param),
            EngineError::PromptTooLong { .. } | EngineError::TokenOutOfRange { .. } | EngineError::EmptyPrompt => Some("messages"),
            _ => None,
        }
    }
}

impl From<kvc_text_front::TextFrontError> for EngineError {
    fn from(e: kvc_text_front::TextFrontError) -> Self {
        use kvc_text_front::TextFrontError as T;
        match e {
            T::InvalidParam { param, message } => EngineError::InvalidParam { param, message },
            T::Template(m) => EngineError::Template(m),
            T::Tokenizer(m) => EngineError::Tokenizer(m),
            T::Load(m) => EngineError::Load(m),
            T::InvalidGrammar(m) => EngineError::InvalidGrammar(m),
        }
    }
}

impl From<kvc_model_loading::LoadError> for EngineError {
    fn from(e: kvc_model_loading::LoadError) -> Self {
        match e {
            kvc_model_loading::LoadError::Download(m) => EngineError::Download(m),
            kvc_model_loading::LoadError::Read(m) => EngineError::Load(m),
        }
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Model(e.to_string())
    }
}
