//! The scheduler's limits, with vLLM's flag names and meanings where vLLM
//! has them (`--max-num-seqs`, `--max-num-batched-tokens`,
//! `--max-num-partial-prefills`, `--max-long-partial-prefills`,
//! `--long-prefill-token-threshold`).

/// Default growth reserved per running sequence: 32 blocks of 16.
pub const DEFAULT_GROWTH_RESERVE_TOKENS: usize = 512;

/// Default steps in which smaller requests may pass one held back for
/// memory (about 2 s at the default 100 ms step).
pub const DEFAULT_MAX_HEAD_OF_LINE_STEPS: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running (decoding or mid-prefill) at once.
    pub max_num_seqs: usize,
    /// Most tokens in one step (prefill chunks + decodes).
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    /// Most sequences mid-prefill at once.
    pub max_num_partial_prefills: usize,
    /// Of those, most long ones (more than `long_prefill_token_threshold`
    /// tokens to compute) taking chunks in one step.
    pub max_long_partial_prefills: usize,
    /// A prompt with more tokens than this to compute (after cache reuse)
    /// is long.
    pub long_prefill_token_threshold: usize,
    /// Blocks kept free at admission beyond what the admitted prompt needs,
    /// so that running sequences can grow without preempting (vLLM's
    /// watermark).
    pub watermark_blocks: usize,
    /// Growth, in tokens, reserved at admission for each running sequence
    /// (less when its `max_new_tokens` ends it sooner).
    pub growth_reserve_tokens: usize,
    /// Steps in which younger sequences may be admitted past the oldest
    /// waiting one while it is held back for memory (0: never; strict
    /// arrival order, as vLLM's FCFS).
    pub max_head_of_line_steps: usize,
}

impl SchedulerConfig {
    /// The defaults for a pool of `num_blocks` blocks and a context cap of
    /// `max_model_len` tokens: four partial prefills of which one long;
    /// long means over 4 % of the context cap (vLLM's rule); a watermark of
    /// 1 % of the pool (vLLM's), and 512 tokens of growth per running sequence.
    pub fn new(max_num_seqs: usize, max_num_batched_tokens: usize, block_size: usize, num_blocks: usize, max_model_len: usize) -> Self {
        Self {
            max_num_seqs,
            max_num_batched_tokens,
            block_size,
            max_num_partial_prefills: 4,
            max_long_partial_prefills: 1,
            long_prefill_token_threshold: (max_model_len * 4 / 100).max(block_size),
            watermark_blocks: num_blocks.div_ceil(100),
            growth_reserve_tokens: DEFAULT_GROWTH_RESERVE_TOKENS,
            max_head_of_line_steps: DEFAULT_MAX_HEAD_OF_LINE_STEPS,
        }
    }
}
