//! Turning a list of block copies into few large byte ranges.
//!
//! kv-pool stores `[layer][block][k|v][slot][kv_head][head_dim]` in one
//! region, so one block of one layer is one contiguous range and
//! consecutive blocks of a layer are adjacent. Copies whose source *and*
//! destination blocks are both consecutive merge into one range (and, when
//! a run covers whole layers on both sides, across layers too), which is
//! what keeps the number of transfer tasks small.

use kvc_kv_pool::BlockId;
use serde::{Deserialize, Serialize};

use crate::handshake::HandshakeRecord;
use crate::{DisaggError, Result};

/// Copy block `src` of the local pool into block `dst` of the remote pool,
/// in one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockCopy {
    pub layer: u32,
    pub src: BlockId,
    pub dst: BlockId,
}

impl BlockCopy {
    /// The same block pairs in every layer `0..num_layers`: a sequence's KV.
    pub fn all_layers(num_layers: usize, src: &[BlockId], dst: &[BlockId]) -> Vec<BlockCopy> {
        assert_eq!(src.len(), dst.len(), "source and destination block lists differ in length");
        (0..num_layers as u32).flat_map(|layer| src.iter().zip(dst).map(move |(&src, &dst)| BlockCopy { layer, src, dst })).collect()
    }
}

/// `len` bytes from `src_offset` of the local region to `dst_offset` of
/// the remote region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    pub src_offset: u64,
    pub dst_offset: u64,
    pub len: u64,
}

/// The coalesced byte ranges of `copies` from the `local` pool to the
/// `remote` one (records already checked compatible). Refuses blocks
/// outside either pool and two copies into the same destination block.
pub fn plan_writes(local: &HandshakeRecord, remote: &HandshakeRecord, copies: &[BlockCopy]) -> Result<Vec<ByteRange>> {
    // One bit per destination block of the remote pool.
    let mut seen = vec![0u64; (remote.num_layers * remote.num_blocks).div_ceil(64)];
    let mut ranges = Vec::with_capacity(copies.len());
    for c in copies {
        check_block("source", local, c.layer, c.src)?;
        check_block("destination", remote, c.layer, c.dst)?;
        let bit = c.layer as usize * remote.num_blocks + c.dst as usize;
        if seen[bit / 64] & (1 << (bit % 64)) != 0 {
            return Err(DisaggError::DuplicateDestination { layer: c.layer, block: c.dst });
        }
        seen[bit / 64] |= 1 << (bit % 64);
        ranges.push(ByteRange {
            src_offset: local.offset(c.layer as usize, c.src as usize),
            dst_offset: remote.offset(c.layer as usize, c.dst as usize),
            len: local.block_stride,
        });
    }
    Ok(coalesce(ranges))
}

/// Sorts by source offset and merges ranges adjacent on both sides.
pub fn coalesce(mut ranges: Vec<ByteRange>) -> Vec<ByteRange> {
    ranges.sort_unstable_by_key(|r| (r.src_offset, r.dst_offset));
    let mut out: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.src_offset + last.len == r.src_offset && last.dst_offset + last.len == r.dst_offset => {
                last.len += r.len;
            }
            _ => out.push(r),
        }
    }
    out
}

fn check_block(side: &'static str, pool: &HandshakeRecord, layer: u32, block: BlockId) -> Result<()> {
    if (layer as usize) < pool.num_layers && (block as usize) < pool.num_blocks {
        Ok(())
    } else {
        Err(DisaggError::BlockOutOfRange { side, layer, block, num_layers: pool.num_layers, num_blocks: pool.num_blocks })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;
    use kvc_kv_pool::{KvLayout, MemoryRegion};

    use super::*;

    const BLOCK: u64 = 2 * 4 * 2 * 8 * 2; // k|v x block_size x heads x head_dim x bf16

    fn pool(num_layers: usize, num_blocks: usize) -> HandshakeRecord {
        let layout = KvLayout { num_layers, num_kv_heads: 2, head_dim: 8, block_size: 4, dtype: DType::BF16 };
        let len = layout.layer_block_bytes() * num_blocks * num_layers;
        HandshakeRecord::describe(&layout, num_blocks, MemoryRegion::host(4096, len), "p:1")
    }

    fn copies(layer: u32, pairs: &[(u32, u32)]) -> Vec<BlockCopy> {
        pairs.iter().map(|&(src, dst)| BlockCopy { layer, src, dst }).collect()
    }

    #[test]
    fn runs_consecutive_on_both_sides_merge_into_one_range() {
        let (a, b) = (pool(2, 16), pool(2, 32));
        let plan = plan_writes(&a, &b, &copies(1, &[(5, 20), (3, 18), (4, 19)])).unwrap();
        assert_eq!(plan, vec![ByteRange { src_offset: a.offset(1, 3), dst_offset: b.offset(1, 18), len: 3 * BLOCK }]);
    }

    #[test]
    fn runs_consecutive_on_one_side_only_stay_apart() {
        let (a, b) = (pool(1, 16), pool(1, 16));
        // src consecutive, dst not; then dst consecutive, src not
        assert_eq!(plan_writes(&a, &b, &copies(0, &[(1, 7), (2, 3)])).unwrap().len(), 2);
        assert_eq!(plan_writes(&a, &b, &copies(0, &[(1, 7), (5, 8)])).unwrap().len(), 2);
    }

    #[test]
    fn scattered_list_gives_one_range_per_run() {
        let (a, b) = (pool(1, 64), pool(1, 64));
        // runs: 10..13 -> 40..43, 20 -> 2, 30..32 -> 50..52
        let list = copies(0, &[(30, 50), (10, 40), (20, 2), (11, 41), (31, 51), (12, 42)]);
        let plan = plan_writes(&a, &b, &list).unwrap();
        let lens: Vec<u64> = plan.iter().map(|r| r.len / BLOCK).collect();
        assert_eq!(lens, vec![3, 1, 2]);
        assert_eq!(plan.iter().map(|r| r.len).sum::<u64>(), list.len() as u64 * BLOCK);
    }

    #[test]
    fn whole_layers_merge_across_layers_when_pools_match() {
        let (a, b) = (pool(3, 8), pool(3, 8));
        let all: Vec<u32> = (0..8).collect();
        let plan = plan_writes(&a, &b, &BlockCopy::all_layers(3, &all, &all)).unwrap();
        assert_eq!(plan, vec![ByteRange { src_offset: 0, dst_offset: 0, len: 3 * 8 * BLOCK }]);
        // a larger remote pool breaks the cross-layer adjacency on its side
        let plan = plan_writes(&a, &pool(3, 9), &BlockCopy::all_layers(3, &all, &all)).unwrap();
        assert_eq!(plan.len(), 3);
    }

    #[test]
    fn blocks_outside_either_pool_are_refused() {
        let (a, b) = (pool(2, 8), pool(2, 4));
        let src_oob = plan_writes(&a, &b, &copies(0, &[(8, 0)])).unwrap_err();
        assert!(matches!(src_oob, DisaggError::BlockOutOfRange { side: "source", .. }), "{src_oob}");
        let dst_oob = plan_writes(&a, &b, &copies(0, &[(0, 4)])).unwrap_err();
        assert!(matches!(dst_oob, DisaggError::BlockOutOfRange { side: "destination", .. }), "{dst_oob}");
        let layer_oob = plan_writes(&a, &b, &copies(2, &[(0, 0)])).unwrap_err();
        assert!(matches!(layer_oob, DisaggError::BlockOutOfRange { layer: 2, .. }), "{layer_oob}");
    }

    #[test]
    fn two_copies_into_one_destination_are_refused() {
        let (a, b) = (pool(1, 8), pool(1, 8));
        let err = plan_writes(&a, &b, &copies(0, &[(1, 3), (2, 3)])).unwrap_err();
        assert!(matches!(err, DisaggError::DuplicateDestination { layer: 0, block: 3 }), "{err}");
    }
}
