use thiserror::Error;

#[derive(Debug, Error)]
pub enum KvPoolError {
    #[error("KV pool of {blocks} blocks x {bytes_per_block} bytes does not fit in memory")]
    TooLarge { blocks: usize, bytes_per_block: usize },
    #[error("unsupported KV dtype {0:?} (f32, bf16 and f16 are supported)")]
    UnsupportedDType(candle_core::DType),
    #[error("block {block} is out of range (pool has {num_blocks})")]
    BlockOutOfRange { block: u32, num_blocks: usize },
    #[error("slot {slot} is beyond the block table ({blocks} blocks of {block_size})")]
    SlotOutOfRange { slot: usize, blocks: usize, block_size: usize },
    #[error("tensor shape mismatch: {0}")]
    Shape(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
