//! The reuse rule: how many prompt tokens a worker's resident KV spares.

/// Prompt tokens that `resident_tokens` of the session's KV let a worker
/// skip: reuse is in whole blocks of `block_size` tokens (clamped to at
/// least 1), and the last prompt token is always computed (its logits are
/// the first sample). That is `min(resident, prompt - 1)` rounded down to
/// whole blocks; 0 for an empty prompt.
///
/// A `block_size` of 1 gives the rule at token granularity, for a caller
/// that does not know the block size of the KV it counts.
pub fn reusable_tokens(resident_tokens: usize, prompt_tokens: usize, block_size: usize) -> usize {
    let bs = block_size.max(1);
    resident_tokens.min(prompt_tokens.saturating_sub(1)) / bs * bs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_is_in_whole_blocks() {
        assert_eq!(reusable_tokens(100, 1000, 16), 96);
        assert_eq!(reusable_tokens(15, 1000, 16), 0);
        assert_eq!(reusable_tokens(16, 1000, 16), 16);
        for resident in 0..200 {
            for bs in 1..20 {
                assert_eq!(reusable_tokens(resident, 150, bs) % bs, 0);
            }
        }
    }

    #[test]
    fn the_last_prompt_token_is_always_computed() {
        for prompt in 1..100 {
            for bs in 1..20 {
                assert!(reusable_tokens(prompt, prompt, bs) < prompt, "prompt {prompt} bs {bs}");
            }
        }
        // A prompt that is exactly the resident blocks gives up its last block.
        assert_eq!(reusable_tokens(32, 32, 16), 16);
        assert_eq!(reusable_tokens(33, 33, 16), 32);
        assert_eq!(reusable_tokens(0, 0, 16), 0);
        assert_eq!(reusable_tokens(10, 0, 16), 0);
        assert_eq!(reusable_tokens(10, 1, 1), 0);
    }

    #[test]
    fn resident_beyond_the_prompt_counts_only_up_to_it() {
        assert_eq!(reusable_tokens(10_000, 300, 16), 288);
        assert_eq!(reusable_tokens(10_000, 300, 1), 299);
        assert_eq!(reusable_tokens(usize::MAX, 300, 16), 288);
    }

    #[test]
    fn block_size_zero_is_taken_as_one() {
        assert_eq!(reusable_tokens(100, 1000, 0), reusable_tokens(100, 1000, 1));
        assert_eq!(reusable_tokens(100, 1000, 0), 100);
        assert_eq!(reusable_tokens(5000, 1000, 0), 999);
    }

    #[test]
    fn block_size_one_is_the_token_granular_rule() {
        for resident in 0..50 {
            for prompt in 0..50usize {
                assert_eq!(reusable_tokens(resident, prompt, 1), resident.min(prompt.saturating_sub(1)));
            }
        }
    }
}
