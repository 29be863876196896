//! The crate's one error type. The binary wraps it in `anyhow`; a failed
//! *request* is not an error here but a row with `ok: false` (see
//! [`crate::metrics::RequestRecord`]), because a replay must finish and
//! count its failures rather than stop at the first one.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A trace line that cannot be used; `line` is 1-based.
    #[error("{path}:{line}: {message}")]
    Trace { path: String, line: usize, message: String },

    /// Flags or parameters that do not make sense together.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The endpoint could not be reached or spoke something other than HTTP/1.1.
    #[error("http: {0}")]
    Http(String),

    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl ReplayError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        ReplayError::Io { path: path.display().to_string(), source }
    }

    pub fn trace(path: &Path, line: usize, message: impl Into<String>) -> Self {
        ReplayError::Trace { path: path.display().to_string(), line, message: message.into() }
    }
}

pub type Result<T> = std::result::Result<T, ReplayError>;
