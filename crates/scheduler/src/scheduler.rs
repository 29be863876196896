//! The step planner.

use std::collections::{HashMap, VecDeque};

use kvc_kv_pool::{BlockAllocator, BlockId};

use crate::sequence::{SeqId, SeqStatus, Sequence};

/// What the scheduler asks of the KV caches around it.
pub trait SchedulerHooks {
    /// Frees cached KV that no running sequence uses until `n` blocks are
    /// free, if it can.
    fn reclaim(&mut self, n: usize, alloc: &mut BlockAllocator);
    /// Blocks (one reference each, now owned by the sequence) already
    /// holding the KV of the first `tokens` tokens of a sequence about to
    /// be admitted; None when nothing is reusable.
    fn acquire(&mut self, seq: &Sequence, alloc: &mut BlockAllocator) -> Option<(Vec<BlockId>, usize)>;
}

/// Hooks for a scheduler without caches.
pub struct NoCache;

impl SchedulerHooks for NoCache {
    fn reclaim(&mut self, _n: usize, _alloc: &mut BlockAllocator) {}
    fn acquire(&mut self, _seq: &Sequence, _alloc: &mut BlockAllocator) -> Option<(Vec<BlockId>, usize)> {
        None
    }
}

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
}

/// One sequence's work in a step: tokens `start..start + len` of its
/// token list. `sample` is true when the chunk reaches the end of the
/// sequence, so its last logits give the next token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub seq_id: SeqId,
    pub start: usize,
    pub len: usize,
    pub sample: bool,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub chunks: Vec<ScheduledChunk>,
    /// Sequences preempted while planning this step (freed, re-queued).
    pub preempted: Vec<SeqId>,
    /// Sequences that can never fit in the pool, even alone; the caller
    /// must finish them (they hold no blocks any more).
    pub unfittable: Vec<SeqId>,
}

pub struct Scheduler {
    config: SchedulerConfig,
    seqs: HashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    /// In arrival order.
    running: Vec<SeqId>,
    next_arrival: u64,
    preemptions_total: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self { config, seqs: HashMap::new(), waiting: VecDeque::new(), running: Vec::new(), next_arrival: 0, preemptions_total: 0 }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>) {
        let seq = Sequence::new(id, prompt, self.next_arrival);
        self.next_arrival += 1;
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
    }

    /// Adds a sequence whose first `computed` tokens already have KV in
    /// `blocks` (filled by a peer, or reserved with a session's KV). With
    /// `running`, it joins the running set at once (its prompt is complete
    /// and a token was appended); otherwise it waits for admission like any
    /// other, keeping its blocks.
    pub fn add_seeded(&mut self, id: SeqId, prompt: Vec<u32>, blocks: Vec<BlockId>, computed: usize, running: bool) {
        debug_assert!(computed <= prompt.len() && computed <= blocks.len() * self.config.block_size);
        let mut seq = Sequence::new(id, prompt, self.next_arrival);
        self.next_arrival += 1;
        seq.block_table = blocks;
        seq.num_computed = computed;
        seq.acquired = true;
        if running {
            seq.status = SeqStatus::Running;
            self.running.push(id);
        } else {
            self.waiting.push_back(id);
        }
        self.seqs.insert(id, seq);
    }

    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Prompt tokens still to be computed, over every sequence (waiting and
    /// running): the prefill backlog a new prompt would queue behind.
    pub fn pending_prefill_tokens(&self) -> usize {
        self.seqs.values().map(|s| s.prompt_len.saturating_sub(s.num_computed)).sum()
    }

    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn preemptions_total(&self) -> u64 {
        self.preemptions_total
    }

    /// Records that `len` more tokens of `id` now have KV in the pool.
    pub fn mark_computed(&mut self, id: SeqId, len: usize) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.num_computed += len;
            debug_assert!(s.num_computed <= s.tokens.len());
        }
    }

    /// Appends a sampled token.
    pub fn append_token(&mut self, id: SeqId, token: u32) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.tokens.push(token);
        }
    }

    /// Removes a finished or cancelled sequence and frees its blocks.
    /// Returns it (None if unknown).
    pub fn remove(&mut self, id: SeqId, alloc: &mut BlockAllocator) -> Option<Sequence> {
        let seq = self.seqs.remove(&id)?;
        alloc.free_all(&seq.block_table);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        Some(seq)
    }

    /// Waiting sequences in admission order.
    pub fn waiting(&self) -> impl Iterator<Item = &Sequence> {
        self.waiting.iter().map(|id| &self.seqs[id])
    }

    /// Makes sure `id` has blocks for its first `tokens` tokens, asking
    /// `reclaim` to free cached KV when the pool is short.
    fn grow(&mut self, id: SeqId, tokens: usize, alloc: &mut BlockAllocator, hooks: &mut dyn SchedulerHooks) -> bool {
        let seq = &self.seqs[&id];
        let need = tokens.div_ceil(self.config.block_size).saturating_sub(seq.block_table.len());
        if need == 0 {
            return true;
        }
        if alloc.num_free() < need {
            hooks.reclaim(need, alloc);
        }
        let seq = self.seqs.get_mut(&id).expect("scheduled sequence exists");
        match alloc.allocate(need) {
            Some(blocks) => {
                seq.block_table.extend(blocks);
                true
            }
            None => false,
        }
    }

    fn preempt(&mut self, id: SeqId, alloc: &mut BlockAllocator) {
        let seq = self.seqs.get_mut(&id).expect("preempted sequence exists");
        alloc.free_all(&seq.block_table);
        seq.block_table.clear();
        seq.num_computed = 0;
        seq.acquired = false;
        seq.status = SeqStatus::Waiting;
        seq.preemptions += 1;
        self.preemptions_total += 1;
        self.running.retain(|&r| r != id);
        // Back to the front: it is older than everything still waiting.
        self.waiting.push_front(id);
        tracing::debug!(event = "preempt", seq_id = id, "preempted sequence for recompute");
    }

    /// Plans one step.
    /// Releases reused blocks of a waiting sequence that could not be
    /// admitted (it acquires again when its turn comes). True if it had any.
    fn unseed_waiting_head(&mut self, alloc: &mut BlockAllocator) -> bool {
        let Some(&id) = self.waiting.front() else {
            return false;
        };
        let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
        if seq.block_table.is_empty() {
            return false;
        }
        alloc.free_all(&seq.block_table);
        seq.block_table.clear();
        seq.num_computed = 0;
        seq.acquired = false;
        true
    }

    pub fn schedule(&mut self, alloc: &mut BlockAllocator, hooks: &mut dyn SchedulerHooks) -> Schedule {
        let mut out = Schedule::default();
        let mut budget = self.config.max_num_batched_tokens;
        let capacity_tokens = alloc.num_blocks() * self.config.block_size;

        // 1. Running sequences, oldest first. A running sequence that cannot
        //    get a block preempts the newest running one (possibly itself).
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let len = seq.remaining().min(budget);
            let (start, end) = (seq.num_computed, seq.num_computed + len);
            if end > capacity_tokens {
                self.preempt(id, alloc);
                self.waiting.retain(|&w| w != id);
                out.unfittable.push(id);
                continue;
            }
            let mut scheduled = true;
            while !self.grow(id, end, alloc, hooks) {
                if self.unseed_waiting_head(alloc) {
                    continue;
                }
                let newest = *self.running.last().expect("running is not empty");
                self.preempt(newest, alloc);
                out.preempted.push(newest);
                if newest == id {
                    scheduled = false;
                    break;
                }
            }
            if !scheduled {
                continue; // `id` left `running`; index i now points past it
            }
            let sample = end == self.seqs[&id].tokens.len();
            out.chunks.push(ScheduledChunk { seq_id: id, start, len, sample });
            budget -= len;
            i += 1;
        }
        // Chunks planned before a later preemption may belong to sequences
        // preempted afterwards: drop them.
        out.chunks.retain(|c| self.seqs[&c.seq_id].status == SeqStatus::Running);

        if !out.preempted.is_empty() {
            // Memory is short: admitting work now would only thrash.
            return out;
        }

        // 2. Waiting sequences, in order, while budget, sequence slots and
        //    free blocks last. No preemption to admit new work.
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let seq = &self.seqs[&id];
            if seq.tokens.len() + 1 > capacity_tokens {
                self.waiting.pop_front();
                out.unfittable.push(id);
                continue;
            }
            if !seq.acquired {
                let found = hooks.acquire(seq, alloc);
                let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
                seq.acquired = true;
                if let Some((blocks, tokens)) = found {
                    debug_assert!(seq.block_table.is_empty() && tokens < seq.tokens.len());
                    seq.block_table = blocks;
                    seq.num_computed = tokens;
                }
            }
            let seq = &self.seqs[&id];
            let start = seq.num_computed;
            let want_blocks = (start + seq.remaining().min(budget)).div_ceil(self.config.block_size);
            let missing = want_blocks.saturating_sub(seq.block_table.len());
            if alloc.num_free() < missing {
                hooks.reclaim(missing, alloc);
            }
            let seq = &self.seqs[&id];
            let have = seq.block_table.len() * self.config.block_size;
            let fit = have + alloc.num_free() * self.config.block_size - start;
            let len = seq.remaining().min(budget).min(fit);
            if len == 0 {
                break;
            }
            let ok = self.grow(id, start + len, alloc, hooks);
            debug_assert!(ok, "blocks were counted as free");
            self.waiting.pop_front();
            let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
            seq.status = SeqStatus::Running;
            let sample = start + len == seq.tokens.len();
            self.running.push(id);
            self.running.sort_by_key(|r| self.seqs[r].arrival);
            out.chunks.push(ScheduledChunk { seq_id: id, start, len, sample });
            budget -= len;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(seqs: usize, tokens: usize) -> Scheduler {
        Scheduler::new(SchedulerConfig { max_num_seqs: seqs, max_num_batched_tokens: tokens, block_size: 4 })
    }

    /// Applies a schedule as the engine would, sampling token 7.
    fn apply(s: &mut Scheduler, plan: &Schedule) {
        for c in &plan.chunks {
            s.mark_computed(c.seq_id, c.len);
            if c.sample {
                s.append_token(c.seq_id, 7);
            }
        }
    }

    #[test]
    fn seeded_sequences_compute_only_what_they_lack() {
        let mut alloc = BlockAllocator::new(100);
        let mut s = sched(8, 64);
        // A filled prompt of 10 tokens with its first token appended: decodes next.
        let blocks = alloc.allocate(3).unwrap();
        let mut filled = vec![1; 10];
        filled.push(5);
        s.add_seeded(1, filled, blocks, 10, true);
        // A reserved prompt of 12 tokens holding 8: computes tokens 8..12.
        let blocks = alloc.allocate(3).unwrap();
        s.add_seeded(2, vec![2; 12], blocks, 8, false);
        let p = s.schedule(&mut alloc, &mut NoCache);
        let got: Vec<(u64, usize, usize, bool)> = p.chunks.iter().map(|c| (c.seq_id, c.start, c.len, c.sample)).collect();
        assert_eq!(got, vec![(1, 10, 1, true), (2, 8, 4, true)]);
        assert_eq!(alloc.num_free(), 94, "no block allocated beyond the seeded ones");
    }

    #[test]
    fn long_prompt_is_split_into_budget_sized_chunks() {
        let mut alloc = BlockAllocator::new(100);
        let mut s = sched(8, 8);
        s.add(1, vec![1; 20]);
        let lens: Vec<(usize, usize, bool)> = (0..3)
            .map(|_| {
                let p = s.schedule(&mut alloc, &mut NoCache);
                apply(&mut s, &p);
                (p.chunks[0].start, p.chunks[0].len, p.chunks[0].sample)
            })
            .collect();
        assert_eq!(lens, vec![(0, 8, false), (8, 8, false), (16, 4, true)]);
    }

    #[test]
    fn the_prefill_backlog_counts_prompt_tokens_not_yet_computed() {
        let mut alloc = BlockAllocator::new(100);
        let mut s = sched(8, 8);
        s.add(1, vec![1; 20]);
        let blocks = alloc.allocate(2).unwrap();
        s.add_seeded(2, vec![2; 12], blocks, 8, false);
        assert_eq!(s.pending_prefill_tokens(), 20 + 4);
        // One step of 8 tokens: a chunk of sequence 1 (oldest first).
        let p = s.schedule(&mut alloc, &mut NoCache);
        apply(&mut s, &p);
        assert_eq!(s.pending_prefill_tokens(), 24 - p.chunks.iter().map(|c| c.len).sum::<usize>());
        // Generated tokens are not prompt: a finished prefill leaves nothing.
        while s.pending_prefill_tokens() > 0 {
            let p = s.schedule(&mut alloc, &mut NoCache);
            apply(&mut s, &p);
        }
        assert_eq!(s.pending_prefill_tokens(), 0);
    }

    #[test]
    fn decodes_come_before_new_prefills() {
        let mut alloc = BlockAllocator::new(100);
        let mut s = sched(8, 6);
        s.add(1, vec![1; 3]);
        let p = s.schedule(&mut alloc, &mut NoCache);
        apply(&mut s, &p);
        s.add(2, vec![1; 10]);
        let p = s.schedule(&mut alloc, &mut NoCache);
        assert_eq!(p.chunks[0], ScheduledChunk { seq_id: 1, start: 3, len: 1, sample: true });
        assert_eq!(p.chunks[1], ScheduledChunk { seq_id: 2, start: 0, len: 5, sample: false });
    }

    #[test]
    fn max_num_seqs_caps_the_batch() {
        let mut alloc = BlockAllocator::new(100);
        let mut s = sched(2, 100);
        for id in 0..3 {
            s.add(id, vec![1; 2]);
        }
        let p = s.schedule(&mut alloc, &mut NoCache);
        assert_eq!(p.chunks.len(), 2);
        assert_eq!(s.num_waiting(), 1);
    }

    #[test]
    fn out_of_blocks_preempts_newest_and_frees_everything_at_the_end() {
        let mut alloc = BlockAllocator::new(4); // 16 tokens
        let mut s = sched(8, 100);
        s.add(1, vec![1; 4]);
        s.add(2, vec![1; 4]);
        s.add(3, vec![1; 4]);
        let p = s.schedule(&mut alloc, &mut NoCache);
        apply(&mut s, &p);
        assert_eq!(p.chunks.len(), 3);
        // Every sequence now needs a second block; only one is free.
        let p = s.schedule(&mut alloc, &mut NoCache);
        assert_eq!(p.preempted, vec![3]);
        assert_eq!(p.chunks.iter().map(|c| c.seq_id).collect::<Vec<_>>(), vec![1, 2]);
        apply(&mut s, &p);
        // Drive to completion: each sequence generates 6 tokens.
        let mut done = Vec::new();
        for _ in 0..200 {
            let p = s.schedule(&mut alloc, &mut NoCache);
            apply(&mut s, &p);
            for c in p.chunks.iter().filter(|c| c.sample) {
                if s.get(c.seq_id).unwrap().num_generated() >= 6 {
                    s.remove(c.seq_id, &mut alloc);
                    done.push(c.seq_id);
                }
            }
            if s.is_idle() {
                break;
            }
        }
        done.sort();
        assert_eq!(done, vec![1, 2, 3]);
        assert_eq!(alloc.num_free(), 4);
        assert!(s.preemptions_total() >= 1);
    }

    #[test]
    fn a_sequence_larger_than_the_pool_is_reported_not_looped_on() {
        let mut alloc = BlockAllocator::new(2);
        let mut s = sched(8, 100);
        s.add(1, vec![1; 9]);
        let p = s.schedule(&mut alloc, &mut NoCache);
        assert_eq!(p.unfittable, vec![1]);
        assert!(p.chunks.is_empty());
        s.remove(1, &mut alloc);
        assert_eq!(alloc.num_free(), 2);
    }

    #[test]
    fn removing_a_running_sequence_frees_its_blocks() {
        let mut alloc = BlockAllocator::new(10);
        let mut s = sched(8, 100);
        s.add(1, vec![1; 9]);
        let p = s.schedule(&mut alloc, &mut NoCache);
        apply(&mut s, &p);
        assert_eq!(alloc.num_free(), 7);
        s.remove(1, &mut alloc);
        assert_eq!(alloc.num_free(), 10);
        assert!(s.is_idle());
    }
}
