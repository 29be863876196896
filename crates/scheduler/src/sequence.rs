//! A request as the scheduler sees it: tokens, progress, blocks.

use kvc_kv_pool::BlockTable;

pub type SeqId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    Waiting,
    Running,
}

#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: SeqId,
    /// Prompt followed by the tokens generated so far.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose KV is in the pool.
    pub num_computed: usize,
    pub block_table: BlockTable,
    pub status: SeqStatus,
    /// Submission order: older sequences go first among equals.
    pub arrival: u64,
    /// Times this sequence was preempted.
    pub preemptions: u32,
    /// Reusable KV was looked up since the last (re)admission.
    pub acquired: bool,
    /// Tokens it may still generate at most (`max_tokens`); bounds the
    /// growth reserved for it.
    pub max_new_tokens: usize,
    /// Admitted with more than the long-prefill threshold to compute.
    pub long_prefill: bool,
    /// Tokens whose KV was computed once and lost to preemption: computing
    /// them again is recompute.
    pub recompute_until: usize,
}

impl Sequence {
    pub fn new(id: SeqId, prompt: Vec<u32>, arrival: u64) -> Self {
        let prompt_len = prompt.len();
        Self {
            id,
            tokens: prompt,
            prompt_len,
            num_computed: 0,
            block_table: Vec::new(),
            status: SeqStatus::Waiting,
            arrival,
            preemptions: 0,
            acquired: false,
            max_new_tokens: usize::MAX,
            long_prefill: false,
            recompute_until: 0,
        }
    }

    /// Tokens still to run through the model before the next sample.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Running with one token to compute: its chunks are decodes.
    pub fn is_decoding(&self) -> bool {
        self.status == SeqStatus::Running && self.remaining() == 1
    }

    /// It generated all it may (`max_new_tokens`: the request's
    /// `max_tokens`, less where the context cap ends it sooner).
    pub fn at_token_limit(&self) -> bool {
        self.num_generated() >= self.max_new_tokens
    }

    pub fn num_generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}
