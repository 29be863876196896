//! Qwen3 (dense) and Qwen3-MoE in candle, over kvc's paged KV pool.
//!
//! The forward pass takes a flattened variable-length batch
//! ([`BatchInput`]): prefill chunks and decode tokens of many sequences run
//! in one call, each sequence reading its context through its block table.

mod attention;
mod batch;
mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fp8;
mod graph_bucket;
pub mod kv_scales;
mod mlp;
mod model;
mod rope;
pub mod row_invariant;
pub mod weights;

pub use batch::{BatchInput, SeqChunk};
pub use config::{MoeConfig, Qwen3Config, QWEN3_30B_A3B};
pub use graph_bucket::graph_bucket;
pub use model::{parse_dtype, read_config, Qwen3Model};
pub use rope::{Rope, RopeScaling};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("config: {0}")]
    Config(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("bad input: {0}")]
    Input(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
