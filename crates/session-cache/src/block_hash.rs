//! Chained block hashes: a full block is named by its parent's hash and its
//! own tokens, so equal hashes mean equal prefixes (tokens are verified on
//! a hit as well). FNV-1a, so every process computes the same value.

pub type BlockHash = u64;

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Hash of a block given its parent's hash (None for the first block).
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(PRIME);
        }
    };
    eat(&parent.unwrap_or(0).to_le_bytes());
    eat(&[parent.is_some() as u8]);
    for t in tokens {
        eat(&t.to_le_bytes());
    }
    h
}

/// The root of a salted hash chain: the parent of a salted prompt's first
/// block (vLLM's `cache_salt`). Chains of different salts (and the
/// unsalted chain, whose first parent is None) never share a hash, so
/// requests with different salts never share cached blocks.
pub fn salt_root(salt: &str) -> BlockHash {
    let mut h = OFFSET;
    for &b in b"kvc-cache-salt\0".iter().chain(salt.as_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Hashes of every full block of `tokens`.
pub fn hash_blocks(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    for chunk in tokens.chunks_exact(block_size) {
        let h = hash_block(parent, chunk);
        out.push(h);
        parent = Some(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_share_hashes_and_a_difference_changes_all_later_ones() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[20] = 999;
        let (ha, hb) = (hash_blocks(&a, 8), hash_blocks(&b, 8));
        assert_eq!(ha.len(), 5);
        assert_eq!(ha[..2], hb[..2]);
        assert!(ha[2..].iter().zip(&hb[2..]).all(|(x, y)| x != y));
    }

    #[test]
    fn salted_chains_share_nothing_with_each_other_or_the_unsalted_one() {
        let blk = [1u32, 2, 3, 4];
        let (a, b) = (salt_root("tenant-a"), salt_root("tenant-b"));
        assert_ne!(a, b);
        let firsts = [hash_block(None, &blk), hash_block(Some(a), &blk), hash_block(Some(b), &blk)];
        assert!(firsts[0] != firsts[1] && firsts[1] != firsts[2] && firsts[0] != firsts[2]);
        assert_eq!(salt_root("tenant-a"), a, "stable across calls (and processes: FNV)");
    }

    #[test]
    fn the_same_block_under_different_parents_hashes_differently() {
        let blk = [1u32, 2, 3, 4];
        assert_ne!(hash_block(None, &blk), hash_block(Some(7), &blk));
    }
}
