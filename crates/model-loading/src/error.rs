//! The model-loading crate's one error type; the engine converts it into
//! its own (`kvc_engine::EngineError::Download`).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LoadError {
    /// Fetching the model from the Hugging Face hub failed (the message
    /// says why and what to do).
    #[error("cannot get the model from the Hugging Face hub: {0}")]
    Download(String),
    /// A checkpoint file could not be read (the path and the error).
    #[error("{0}")]
    Read(String),
}

impl LoadError {
    /// A [`LoadError::Download`] with this message.
    pub fn download(msg: impl Into<String>) -> Self {
        LoadError::Download(msg.into())
    }
}
