//! Token ids for synthesized prompts. Every token is a pure function of
//! (salt, stream, position), so equal hash ids give identical token blocks
//! in every request that names them, and a different salt (another run)
//! gives the same structure with different tokens.

use super::rng::{mix, mix_all};

/// Lowest token id used: ids below are often special in small vocabularies.
pub const TOKEN_MIN: u32 = 10;
/// Ids stay below 150 000: ordinary tokens in Qwen3's 151 936-entry vocabulary.
pub const TOKEN_SPAN: u64 = 149_990;

const KIND_BLOCK: u64 = 1;
const KIND_FRESH: u64 = 2;
const KIND_OUTPUT: u64 = 3;

#[derive(Debug, Clone, Copy)]
pub struct TokenSynth {
    salt: u64,
}

impl TokenSynth {
    pub fn new(salt: u64) -> Self {
        TokenSynth { salt }
    }

    fn stream(&self, seed: u64, n: usize, start: usize, out: &mut Vec<u32>) {
        let base = mix_all(&[self.salt, seed]);
        out.extend((start..start + n).map(|pos| TOKEN_MIN + (mix(base ^ mix(pos as u64)) % TOKEN_SPAN) as u32));
    }

    /// The first `n` tokens of the block named `hash_id`.
    pub fn block(&self, hash_id: u64, n: usize, out: &mut Vec<u32>) {
        self.stream(mix_all(&[KIND_BLOCK, hash_id]), n, 0, out);
    }

    /// Tokens nobody else sends: new user input of `session`'s `turn`
    /// (`part` tells apart several pieces of one turn).
    pub fn fresh(&self, session: u64, turn: u64, part: u64, n: usize, out: &mut Vec<u32>) {
        self.stream(mix_all(&[KIND_FRESH, session, turn, part]), n, 0, out);
    }

    /// The stand-in for the model's answer to `session`'s `turn` that the
    /// next turn carries in its history (see the crate README: the real
    /// answer's token ids are not returned by OpenAI endpoints).
    pub fn output_stand_in(&self, session: u64, turn: u64, n: usize, out: &mut Vec<u32>) {
        self.stream(mix_all(&[KIND_OUTPUT, session, turn]), n, 0, out);
    }
}

/// Common English words, each one token (with its leading space) in the
/// usual BPE vocabularies: the text form of synthesized tokens for
/// `--api chat`, where the server tokenizes.
const WORDS: &[&str] = &[
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " was", " on", " be", " by", " at", " this",
    " are", " from", " or", " have", " an", " they", " which", " one", " you", " were", " her", " all", " she", " there", " would",
    " their", " we", " him", " been", " has", " when", " who", " will", " more", " no", " if", " out", " so", " said", " what", " up",
    " its", " about", " into", " than", " them", " can", " only", " other", " new", " some", " could", " time", " these", " two", " may",
    " then", " do", " first", " any", " my", " now", " such", " like", " our", " over", " man", " me", " even", " most", " made", " after",
    " also", " did", " many", " before", " must", " through", " back", " years", " where", " much", " your", " way", " well", " down",
    " should", " because", " each", " just", " those", " people", " how", " too", " little", " state", " good", " very", " make", " world",
    " still", " own", " see", " men", " work", " long", " get", " here", " between", " both", " life", " being", " under", " never",
    " day", " same", " another", " know", " while", " last", " might", " us", " great", " old", " year", " off", " come", " since",
    " against", " go", " came", " right", " used", " take", " three",
];

/// Text standing for `tokens`: one common word per token (roughly one
/// token each once the server tokenizes it).
pub fn words(tokens: &[u32]) -> String {
    let mut s = String::with_capacity(tokens.len() * 5);
    for &t in tokens {
        s.push_str(WORDS[t as usize % WORDS.len()]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hash_ids_give_identical_blocks_and_partial_blocks_are_prefixes() {
        let s = TokenSynth::new(0);
        let (mut a, mut b, mut half) = (vec![], vec![], vec![]);
        s.block(42, 16, &mut a);
        s.block(42, 16, &mut b);
        s.block(42, 7, &mut half);
        assert_eq!(a, b);
        assert_eq!(&a[..7], &half[..]);
        let mut other = vec![];
        s.block(43, 16, &mut other);
        assert_ne!(a, other);
    }

    #[test]
    fn tokens_stay_in_the_safe_id_range() {
        let s = TokenSynth::new(9);
        let mut t = vec![];
        s.fresh(1, 2, 3, 10_000, &mut t);
        assert!(t.iter().all(|&x| (TOKEN_MIN as u64..TOKEN_MIN as u64 + TOKEN_SPAN).contains(&(x as u64))));
    }

    #[test]
    fn another_salt_changes_the_tokens_not_the_structure() {
        let (mut a, mut b) = (vec![], vec![]);
        TokenSynth::new(1).block(5, 16, &mut a);
        TokenSynth::new(2).block(5, 16, &mut b);
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
    }
}
