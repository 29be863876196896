use std::time::Duration;

use thiserror::Error;

/// Everything that can go wrong moving KV between workers.
#[derive(Debug, Error)]
pub enum DisaggError {
    /// This build links no Mooncake; the message says what to install.
    #[error(transparent)]
    MooncakeUnavailable(#[from] mooncake_sys::MooncakeSysError),

    /// A Mooncake C API call failed.
    #[error("Mooncake {call} failed (code {code}){detail}")]
    Engine { call: &'static str, code: i64, detail: String },

    /// The peer's pool cannot receive ours (or send to it) byte for byte,
    /// or other weights compute its KV.
    #[error("incompatible KV peer: {field} is {local} here but {remote} at the peer")]
    Incompatible { field: &'static str, local: String, remote: String },

    /// The peer checked our record and refused it.
    #[error("the peer refused our KV pool: {reason}")]
    RefusedByPeer { reason: String },

    /// A handshake record that contradicts itself.
    #[error("invalid handshake record: {field} {reason}")]
    InvalidRecord { field: &'static str, reason: String },

    /// A block copy naming a layer or block outside a pool.
    #[error("{side} block (layer {layer}, block {block}) is outside the pool ({num_layers} layers x {num_blocks} blocks)")]
    BlockOutOfRange { side: &'static str, layer: u32, block: u32, num_layers: usize, num_blocks: usize },

    /// Two copies writing the same destination block.
    #[error("destination block (layer {layer}, block {block}) is written twice in one transfer")]
    DuplicateDestination { layer: u32, block: u32 },

    /// A task of the transfer ended in a state other than COMPLETED
    /// (the peer died, reset the connection, or refused the write).
    #[error("transfer to {peer} failed: task {task} of {tasks} is {status}; {done_bytes} of {total_bytes} bytes confirmed")]
    TransferFailed { peer: String, task: usize, tasks: usize, status: &'static str, done_bytes: u64, total_bytes: u64 },

    /// The transfer did not complete within its deadline.
    #[error("transfer to {peer} timed out after {waited:?}; {done_bytes} of {total_bytes} bytes confirmed")]
    Timeout { peer: String, waited: Duration, done_bytes: u64, total_bytes: u64 },

    /// A write polled again after it had failed or timed out.
    #[error("the transfer to {peer} was abandoned after an earlier error")]
    Aborted { peer: String },

    /// The control channel misbehaved (closed, timed out, unexpected message).
    #[error("control channel: {0}")]
    Control(String),

    #[error("control channel I/O: {0}")]
    Io(#[from] std::io::Error),

    #[error("control channel JSON: {0}")]
    Json(#[from] serde_json::Error),

    #[error(transparent)]
    KvPool(#[from] kvc_kv_pool::KvPoolError),
}

pub type Result<T, E = DisaggError> = std::result::Result<T, E>;
