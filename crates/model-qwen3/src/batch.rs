//! The model's input: a flattened, variable-length batch.

use kvc_kv_pool::BlockId;

/// One sequence's part of a batch: `len` new tokens starting at `start` in
/// the flattened token list, ending at position `context_len - 1`.
#[derive(Debug, Clone)]
pub struct SeqChunk<'a> {
    /// Offset of this sequence's first token in [`BatchInput::tokens`].
    pub start: usize,
    /// New tokens in this step (a prefill chunk, or 1 for a decode).
    pub len: usize,
    /// Tokens in the sequence's KV after this step (cached + new).
    pub context_len: usize,
    /// Blocks holding the sequence, covering at least `context_len` tokens.
    pub block_table: &'a [BlockId],
}

impl SeqChunk<'_> {
    /// Position of this chunk's first token.
    pub fn first_position(&self) -> usize {
        self.context_len - self.len
    }
}

/// Tokens of several sequences in one forward pass.
#[derive(Debug, Clone, Default)]
pub struct BatchInput<'a> {
    pub tokens: Vec<u32>,
    pub seqs: Vec<SeqChunk<'a>>,
    /// Rows of the flattened batch whose logits are returned, in this order.
    pub logits_rows: Vec<usize>,
}

impl BatchInput<'_> {
    /// Position of every token.
    pub fn positions(&self) -> Vec<u32> {
        let mut pos = vec![0u32; self.tokens.len()];
        for s in &self.seqs {
            for i in 0..s.len {
                pos[s.start + i] = (s.first_position() + i) as u32;
            }
        }
        pos
    }

    /// Slot (`block * block_size + offset`) of every token.
    pub fn slots(&self, block_size: usize) -> Vec<usize> {
        let mut slots = vec![0usize; self.tokens.len()];
        for s in &self.seqs {
            for i in 0..s.len {
                let p = s.first_position() + i;
                slots[s.start + i] = s.block_table[p / block_size] as usize * block_size + p % block_size;
            }
        }
        slots
    }

    /// Index of the last token of each sequence (where a decode samples).
    pub fn last_rows(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.start + s.len - 1).collect()
    }
}
