//! The client's own count of how much of a prompt *could* be served from
//! cache: the longest prefix, in whole blocks, that an earlier request of
//! this run already sent. The server's reported `cached_tokens` divided by
//! this is how much of the possible reuse the server achieved; the gap is
//! eviction, routing, or a server without a prefix cache.
//!
//! It counts what was *sent* before, not what *finished* before, so under
//! concurrency it can exceed what any server could reuse; with
//! `--concurrency 1` the two definitions agree.

use std::collections::HashSet;

use crate::synth::rng::mix;

pub struct ReuseOracle {
    block_tokens: usize,
    seen: HashSet<u64>,
}

impl ReuseOracle {
    pub fn new(block_tokens: usize) -> Self {
        ReuseOracle { block_tokens: block_tokens.max(1), seen: HashSet::new() }
    }

    /// Tokens of `prompt` reusable from earlier prompts; then remembers
    /// `prompt`. A server must compute at least the last prompt token, so a
    /// prompt seen whole counts all its full blocks but the one holding it.
    pub fn observe(&mut self, prompt: &[u32]) -> usize {
        let b = self.block_tokens;
        let mut hash = 0u64;
        let mut hit_blocks = 0;
        let mut still_hitting = true;
        for block in prompt.chunks_exact(b) {
            hash = block.iter().fold(mix(hash), |h, &t| mix(h ^ t as u64));
            let new = self.seen.insert(hash);
            if still_hitting && !new {
                hit_blocks += 1;
            } else {
                still_hitting = false;
            }
        }
        let max_blocks = prompt.len().saturating_sub(1) / b;
        hit_blocks.min(max_blocks) * b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_whole_blocks_count_and_the_last_token_is_never_reusable() {
        let mut o = ReuseOracle::new(4);
        let a: Vec<u32> = (0..10).collect();
        assert_eq!(o.observe(&a), 0);
        // Same first 9 tokens: two whole blocks (8 tokens) are shared.
        let mut b = a[..9].to_vec();
        b.extend([99, 98, 97]);
        assert_eq!(o.observe(&b), 8);
        // The same 8-token prompt again: 2 blocks seen, but the block
        // holding the last token must be computed.
        assert_eq!(o.observe(&a[..8]), 4);
        // A divergence in block 0 means no reuse at all (chained blocks).
        let mut c = a.clone();
        c[0] = 1000;
        assert_eq!(o.observe(&c), 0);
    }
}
