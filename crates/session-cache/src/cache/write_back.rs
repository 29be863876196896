//! Write-back ahead of pressure: idle sessions' device blocks are copied to
//! the host tier while they stay on the device ([`decide_write_back`] says
//! when and how many; [`decide_eviction`], the eviction cost function, says
//! whose), issued with [`crate::host_tier::HostTier::flush_async`]: no
//! compute waits for them. When eviction later takes such a block it only frees it: no copy on
//! any request's critical path. Only for host tiers whose copies run
//! beside the compute work (a GPU pool's pinned arena): where copies
//! happen when asked for, copying ahead would only add work.

use kvc_kv_pool::{BlockAllocator, BlockId, KvStorage};
use kvc_policy::eviction::decide_eviction;
use kvc_policy::write_back::{decide_write_back, write_back_gate, WriteBack, WriteBackGate, WriteBackInputs};

use super::SessionAwareCache;
use crate::session::BlockLoc;

impl SessionAwareCache {
    /// One write-back pass: when free blocks plus idle blocks already on
    /// the host are under `watermark`, copies up to `max_batch` more idle
    /// blocks (the next eviction victims', tail first, issued in token
    /// order) to the host tier, keeping them on the device. Returns the
    /// decision; copies are issued before it returns.
    pub fn write_back(&mut self, watermark: usize, max_batch: usize, alloc: &BlockAllocator, storage: &KvStorage) -> WriteBack {
        // The common cases, decided without a pass over the sessions.
        let copies_running = self.write_back_ticket.is_some_and(|t| !self.host.done(t));
        let gate = WriteBackGate {
            watermark,
            host_capacity: self.host.capacity(),
            host_asynchronous: self.host.asynchronous(),
            free: alloc.num_free(),
            copies_running,
        };
        if let Some(skip) = write_back_gate(&gate) {
            let decision = WriteBack::Skip(skip);
            kvc_policy::decisions_total::count(&decision.decision());
            return decision;
        }
        // The eviction cost function's view, counting only blocks not yet
        // written back: whose blocks go first.
        let mut candidates = self.idle_candidates(alloc);
        let mirrored_idle: usize = candidates.iter().map(|c| c.mirrored).sum();
        for c in &mut candidates {
            c.device_blocks -= std::mem::take(&mut c.mirrored);
        }
        let inputs = WriteBackInputs {
            free: alloc.num_free(),
            mirrored_idle,
            unmirrored_idle: candidates.iter().map(|c| c.device_blocks).sum(),
            watermark,
            host_free: self.host.num_free(),
            copies_running,
            max_batch,
        };
        let decision = decide_write_back(&inputs);
        let WriteBack::Copy(want) = decision else {
            kvc_policy::log_decision(&decision.decision());
            return decision;
        };
        let mut copied = 0;
        while copied < want {
            let Some(victim) = decide_eviction(&candidates, usize::MAX, alloc.num_blocks()).map(|d| d.session) else {
                break;
            };
            candidates.retain(|c| c.session != victim);
            let mut todo: Vec<BlockId> = self.sessions[&victim]
                .blocks
                .iter()
                .rev()
                .filter_map(|l| match *l {
                    BlockLoc::Device(b) if self.running_refs(alloc, b) == 0 && !self.mirrors.contains_key(&b) => Some(b),
                    _ => None,
                })
                .take(want - copied)
                .collect();
            todo.reverse();
            for b in todo {
                let h = self.host.store(storage, b).expect("decide_write_back counted free host slots");
                self.mirrors.insert(b, h);
                copied += 1;
            }
        }
        self.write_back_ticket = Some(self.host.flush_async());
        self.stats.write_back_blocks.copied += copied as u64;
        kvc_policy::decisions_total::count(&WriteBack::Copy(copied).decision());
        tracing::debug!(
            event = "write_back",
            blocks = copied,
            free = inputs.free,
            mirrored_idle = inputs.mirrored_idle,
            watermark,
            "idle session KV copied to the host tier ahead of pressure"
        );
        WriteBack::Copy(copied)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use kvc_policy::write_back::WriteBackSkip;

    use super::super::tests::{fill, setup, BS};
    use super::*;
    use crate::test_arena::TestArena;
    use crate::{ReusePath, Tier};

    /// A pool of 8 blocks with an asynchronous host tier of 16 slots, and
    /// the switch that keeps its copies running.
    fn async_setup() -> (SessionAwareCache, BlockAllocator, KvStorage, Arc<AtomicBool>) {
        let (mut cache, alloc, storage) = setup(8, 16);
        let arena = TestArena::new(16);
        let busy = arena.busy.clone();
        cache.set_host_arena(Box::new(arena));
        (cache, alloc, storage, busy)
    }

    /// Sessions "a" (3 blocks: the larger, so the eviction victim) and "b"
    /// (2 blocks) committed and idle
    /// on a pool of 8 blocks; returns their tokens and original bytes.
    fn two_sessions(
        cache: &mut SessionAwareCache,
        alloc: &mut BlockAllocator,
        storage: &mut KvStorage,
    ) -> Vec<(&'static str, Vec<u32>, Vec<Vec<u8>>)> {
        let mut out = Vec::new();
        for (id, n, seed) in [("a", 3, 10.0), ("b", 2, 50.0)] {
            let blocks = alloc.allocate(n).unwrap();
            let bytes = fill(storage, &blocks, seed);
            let tokens: Vec<u32> = (0..(n * BS) as u32).map(|t| t + seed as u32 * 100).collect();
            cache.acquire(Some(id), &tokens, None, alloc, storage);
            cache.commit(id, &tokens, &blocks, alloc);
            alloc.free_all(&blocks);
            out.push((id, tokens, bytes));
        }
        out
    }

    #[test]
    fn written_back_blocks_are_evicted_with_no_copy_and_come_back_identical() {
        let (mut cache, mut alloc, mut storage, busy) = async_setup();
        let sessions = two_sessions(&mut cache, &mut alloc, &mut storage);
        assert_eq!(alloc.num_free(), 3);
        // Above the watermark: nothing to do.
        assert_eq!(cache.write_back(3, 64, &alloc, &storage), WriteBack::Skip(WriteBackSkip::AboveWatermark));
        // Under it: the next victim's blocks are copied, and stay on the
        // device; one batch at a time.
        busy.store(true, Ordering::Relaxed);
        assert_eq!(cache.write_back(6, 1, &alloc, &storage), WriteBack::Copy(1));
        assert_eq!(cache.write_back(6, 64, &alloc, &storage), WriteBack::Skip(WriteBackSkip::CopiesRunning));
        busy.store(false, Ordering::Relaxed);
        assert_eq!(cache.write_back(6, 64, &alloc, &storage), WriteBack::Copy(2));
        let per_block = storage.layout().bytes_per_block() as u64;
        assert_eq!(cache.host_bytes_moved(), (3 * per_block, 0));
        assert_eq!(cache.stats.write_back_blocks.copied, 3);
        assert_eq!(cache.session_info("a").unwrap().tier, Tier::Device, "written back, still on the device");
        assert_eq!(alloc.num_free(), 3);
        // Free + written back now cover the watermark.
        assert_eq!(cache.write_back(6, 64, &alloc, &storage), WriteBack::Skip(WriteBackSkip::AboveWatermark));
        // Pressure: eviction takes "a" (its copy is there) with no new copy.
        assert_eq!(cache.reclaim(6, &mut alloc, &storage), 3);
        assert_eq!(cache.host_bytes_moved(), (3 * per_block, 0), "no copy at eviction");
        assert_eq!(cache.stats.write_back_blocks.used, 3);
        assert_eq!(cache.session_info("a").unwrap().tier, Tier::Host);
        // Every device block is overwritten, then "a"'s next turn restores it byte for byte.
        let other = alloc.allocate(6).unwrap();
        fill(&mut storage, &other, -3.0);
        alloc.free_all(&other);
        let (_, tokens, original) = &sessions[0];
        let mut next = tokens.clone();
        next.push(7);
        let got = cache.acquire(Some("a"), &next, None, &mut alloc, &mut storage);
        assert_eq!((got.tokens, got.source, got.restored_blocks), (3 * BS, ReusePath::SessionHit, 3));
        for (i, &b) in got.blocks.iter().enumerate() {
            let bytes: Vec<u8> = (0..2).flat_map(|l| storage.block_bytes(l, b).to_vec()).collect();
            assert_eq!(&bytes, &original[i], "block {i}");
        }
        alloc.free_all(&got.blocks);
        cache.abandon("a");
        // A written-back block whose session goes away frees its host slot.
        cache.write_back(8, 64, &alloc, &storage);
        let copied = cache.stats.write_back_blocks.copied;
        assert!(copied > 3, "more written back under a higher watermark");
        // The prefix index holds one of "b"'s written-back blocks too: its
        // copy goes with the last session that holds it, not with the index.
        let (_, b_tokens, _) = &sessions[1];
        let b_block = match cache.sessions["b"].blocks[0] {
            BlockLoc::Device(blk) => blk,
            BlockLoc::Host(_) => panic!("b is on the device"),
        };
        assert!(cache.mirrors.contains_key(&b_block));
        cache.register_block(None, &b_tokens[..BS], b_block, &mut alloc);
        cache.delete("a", &mut alloc);
        cache.delete("b", &mut alloc);
        assert_eq!(cache.host_free_blocks(), 16, "no written-back copy outlives the sessions");
        cache.reset_prefix_cache(&mut alloc);
        let wb = cache.stats.write_back_blocks;
        assert_eq!(wb.used + wb.discarded, wb.copied, "every written-back block was used or released");
        assert_eq!((alloc.num_free(), cache.host_free_blocks()), (8, 16), "every block and host slot back");
    }

    #[test]
    fn host_tiers_that_copy_at_once_do_not_write_back() {
        let (mut cache, mut alloc, mut storage) = setup(8, 16);
        two_sessions(&mut cache, &mut alloc, &mut storage);
        assert_eq!(cache.write_back(8, 64, &alloc, &storage), WriteBack::Skip(WriteBackSkip::Disabled));
        assert_eq!(cache.host_bytes_moved(), (0, 0));
    }

    /// Where copies run beside compute, a restoring turn gets a ticket to
    /// wait for instead of every later step waiting.
    #[test]
    fn restores_beside_compute_hand_the_request_a_ticket() {
        let (mut cache, mut alloc, mut storage, busy) = async_setup();
        let sessions = two_sessions(&mut cache, &mut alloc, &mut storage);
        cache.reclaim(8, &mut alloc, &storage);
        assert_eq!(cache.session_info("a").unwrap().tier, Tier::Host);
        busy.store(true, Ordering::Relaxed);
        let (_, tokens, original) = &sessions[0];
        let mut next = tokens.clone();
        next.push(1);
        let got = cache.acquire(Some("a"), &next, None, &mut alloc, &mut storage);
        let ticket = got.ready_after.expect("restored beside compute");
        assert!(!cache.copies_done(ticket), "still copying");
        busy.store(false, Ordering::Relaxed);
        assert!(cache.copies_done(ticket));
        for (i, &b) in got.blocks.iter().enumerate() {
            let bytes: Vec<u8> = (0..2).flat_map(|l| storage.block_bytes(l, b).to_vec()).collect();
            assert_eq!(&bytes, &original[i], "block {i}");
        }
        // Nothing restored: readable at once.
        let got_b = cache.acquire(Some("c"), &[1, 2, 3], None, &mut alloc, &mut storage);
        assert_eq!(got_b.ready_after, None);
    }
}
