//! The shape of the KV pool, shared by both ends of a transfer.

use candle_core::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub dtype: DType,
}

impl KvLayout {
    /// Elements of one token's K (or V) in one layer.
    pub fn token_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Elements of one block of one layer, K and V together.
    pub fn block_elems(&self) -> usize {
        2 * self.block_size * self.token_elems()
    }

    /// Bytes of one block of one layer (K and V).
    pub fn layer_block_bytes(&self) -> usize {
        self.block_elems() * self.dtype.size_in_bytes()
    }

    /// Bytes of one block across all layers.
    pub fn bytes_per_block(&self) -> usize {
        self.layer_block_bytes() * self.num_layers
    }

    /// Element offset of (layer, block) in a pool of `num_blocks` blocks.
    pub fn block_offset(&self, num_blocks: usize, layer: usize, block: usize) -> usize {
        (layer * num_blocks + block) * self.block_elems()
    }
}
