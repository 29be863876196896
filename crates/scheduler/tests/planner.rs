//! The planner's properties, driven step by step as the engine drives it
//! (no model, no clock): chunking, decodes every step, fair long prefills
//! with their progress bound, KV-aware admission without recompute storms,
//! and every block back at the end.

use std::collections::HashMap;

use kvc_kv_pool::BlockAllocator;
use kvc_scheduler::{
    AdmitReason, ChunkCost, KvManager, Schedule, ScheduledChunk, Scheduler, SchedulerConfig, SeqId, Sequence, TimeBudget, Wait,
};

fn config(max_num_seqs: usize, max_num_batched_tokens: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        block_size,
        max_num_partial_prefills: 4,
        max_long_partial_prefills: 1,
        long_prefill_token_threshold: 4096,
        watermark_blocks: 0,
        growth_reserve_tokens: 512,
        max_head_of_line_steps: 0,
    }
}

/// The engine's side of a step: marks the chunks computed, samples token 7
/// where a chunk ends its sequence, and finishes sequences that reached
/// their `max_new` (returned).
struct Driver {
    s: Scheduler,
    alloc: BlockAllocator,
    max_new: HashMap<SeqId, usize>,
    computed_tokens: u64,
    finished: Vec<SeqId>,
}

impl Driver {
    fn new(c: SchedulerConfig, blocks: usize) -> Self {
        Self { s: Scheduler::new(c), alloc: BlockAllocator::new(blocks), max_new: HashMap::new(), computed_tokens: 0, finished: vec![] }
    }

    fn add(&mut self, id: SeqId, prompt_len: usize, max_new: usize) {
        self.s.add(id, vec![1; prompt_len]);
        self.s.set_max_new_tokens(id, max_new);
        self.max_new.insert(id, max_new);
    }

    fn step(&mut self) -> Schedule {
        let p = self.s.schedule(&mut self.alloc);
        self.after(p)
    }

    fn step_with<C>(&mut self, caches: &mut C) -> Schedule
    where
        for<'a> Kv<'a, C>: KvManager,
    {
        let p = self.s.schedule(&mut Kv { alloc: &mut self.alloc, caches });
        self.after(p)
    }

    fn after(&mut self, p: Schedule) -> Schedule {
        for id in &p.unfittable {
            self.s.remove(*id, &mut self.alloc);
        }
        self.computed_tokens += p.chunks.iter().map(|c| c.len as u64).sum::<u64>();
        let sampled: Vec<(SeqId, u32)> = p.chunks.iter().filter(|c| c.sample).map(|c| (c.seq_id, 7)).collect();
        let at_limit = self.s.update(&p, &sampled);
        for (id, _) in sampled {
            let done = self.s.get(id).unwrap().num_generated() >= self.max_new[&id];
            // Seeded sequences here have no limit of the scheduler's own.
            assert!(done || !at_limit.contains(&id));
            if done {
                self.s.remove(id, &mut self.alloc);
                self.finished.push(id);
            }
        }
        p
    }

    fn run_to_end(&mut self, max_steps: usize) -> usize {
        for n in 0..max_steps {
            if self.s.is_idle() {
                return n;
            }
            self.step();
        }
        panic!("not idle after {max_steps} steps");
    }
}

fn chunk_of(p: &Schedule, id: SeqId) -> Option<ScheduledChunk> {
    p.chunks.iter().copied().find(|c| c.seq_id == id)
}

#[test]
fn a_long_prompt_is_split_into_budget_sized_chunks() {
    let mut d = Driver::new(config(8, 8, 4), 100);
    d.add(1, 20, 1);
    let got: Vec<(usize, usize, bool)> = (0..3)
        .map(|_| {
            let c = d.step().chunks[0];
            (c.start, c.len, c.sample)
        })
        .collect();
    assert_eq!(got, vec![(0, 8, false), (8, 8, false), (16, 4, true)]);
}

#[test]
fn seeded_sequences_compute_only_what_they_lack() {
    let mut alloc = BlockAllocator::new(100);
    let mut s = Scheduler::new(config(8, 64, 4));
    // A filled prompt of 10 tokens with its first token appended: decodes next.
    let blocks = alloc.allocate(3).unwrap();
    let mut filled = vec![1; 10];
    filled.push(5);
    s.add_seeded(1, filled, blocks, 10, true);
    s.set_max_new_tokens(1, 4);
    // A reserved prompt of 12 tokens holding 8: computes tokens 8..12.
    let blocks = alloc.allocate(3).unwrap();
    s.add_seeded(2, vec![2; 12], blocks, 8, false);
    let p = s.schedule(&mut alloc);
    let got: Vec<(u64, usize, usize, bool)> = p.chunks.iter().map(|c| (c.seq_id, c.start, c.len, c.sample)).collect();
    assert_eq!(got, vec![(1, 10, 1, true), (2, 8, 4, true)]);
    assert_eq!(alloc.num_free(), 94, "no block allocated beyond the seeded ones");
}

#[test]
fn the_prefill_backlog_counts_prompt_tokens_not_yet_computed() {
    let mut d = Driver::new(config(8, 8, 4), 100);
    d.add(1, 20, 3);
    let blocks = d.alloc.allocate(2).unwrap();
    d.s.add_seeded(2, vec![2; 12], blocks, 8, false);
    d.max_new.insert(2, 3);
    assert_eq!(d.s.pending_prefill_tokens(), 20 + 4);
    let p = d.step();
    assert_eq!(d.s.pending_prefill_tokens(), 24 - p.prefill_tokens());
    // Generated tokens are not prompt: a finished prefill leaves nothing.
    while d.s.pending_prefill_tokens() > 0 {
        d.step();
    }
    assert_eq!(d.s.pending_prefill_tokens(), 0);
}

#[test]
fn max_num_seqs_caps_the_batch() {
    let mut d = Driver::new(config(2, 100, 4), 100);
    for id in 0..3 {
        d.add(id, 2, 5);
    }
    let p = d.step();
    assert_eq!(p.chunks.len(), 2);
    assert_eq!(d.s.num_waiting(), 1);
    assert_eq!(p.admission_blocked, Some(AdmitReason::MaxNumSeqs));
    assert_eq!(p.stalled, vec![(2, Wait::Admission)]);
}

#[test]
fn a_sequence_larger_than_the_pool_is_reported_not_looped_on() {
    let mut alloc = BlockAllocator::new(2);
    let mut s = Scheduler::new(config(8, 100, 4));
    s.add(1, vec![1; 9]);
    let p = s.schedule(&mut alloc);
    assert_eq!(p.unfittable, vec![1]);
    assert!(p.chunks.is_empty());
    s.remove(1, &mut alloc);
    assert_eq!(alloc.num_free(), 2);
}

/// The case: a 1,000-token prompt arriving while a 60,000-token
/// one is mid-prefill gets its whole prefill in the next step, which
/// carries no long chunk (it yields the short one's first token); the long
/// one gets its quarter in the step after, and finishes within the bound.
#[test]
fn a_short_prompt_behind_a_long_one_goes_in_the_next_step() {
    let budget = 8192;
    let mut d = Driver::new(config(64, budget, 16), 10_000);
    d.add(1, 60_000, 4);
    let first = d.step();
    assert_eq!(chunk_of(&first, 1).unwrap().len, budget);
    d.add(2, 1_000, 4);
    let next = d.step();
    let short = chunk_of(&next, 2).expect("the short prompt is scheduled in the next step");
    assert_eq!((short.start, short.len, short.sample), (0, 1_000, true), "its whole prefill, first token sampled");
    // The short one's first token comes out of this step, so the long one
    // gets nothing in it: the step is as short as the short prompt's work.
    assert!(chunk_of(&next, 1).is_none(), "the long one waits one step for the short one's first token");
    // The next step gives the long one its share again, whether or not a
    // short prompt finishes in it.
    d.add(3, 500, 1);
    let after = d.step();
    assert_eq!(chunk_of(&after, 3).map(|c| c.len), Some(500), "the second short prompt goes in at once");
    assert_eq!(chunk_of(&after, 1).unwrap().len, budget.div_ceil(4), "a skipped long prompt gets its quarter next");
    // The long prompt finishes within the stated bound, here with the
    // short ones' decodes in the steps after: two steps cost it a full
    // step's tokens.
    let mut steps = 3;
    while d.s.get(1).is_some_and(|s| s.num_generated() == 0) {
        let p = d.step();
        steps += 1;
        if d.s.get(2).is_some() {
            assert!(chunk_of(&p, 2).is_some(), "the short one decodes every step");
        }
    }
    assert!(steps <= 60_000usize.div_ceil(budget) + 2, "{steps} steps");
}

/// A time budget priced by context: 1 us per token plus 1 ns per token of
/// context; 2 ms of prefill alone, 0.5 ms beside decodes.
fn time_budget(min_tokens: usize) -> TimeBudget {
    TimeBudget { alone_s: 2e-3, mixed_s: 5e-4, cost: ChunkCost { a: 1e-6, b: 1e-9, c: 0.0 }, min_tokens }
}

/// With a stream of short prompts (one finishing in every step) and a
/// small time budget beside their decodes, the oldest long prefill still
/// gets a quarter of at least one of any two consecutive steps: the
/// stated bound holds.
#[test]
fn a_long_prompt_progresses_under_a_stream_of_short_ones() {
    let mut c = config(256, 2048, 16);
    c.max_num_partial_prefills = 8;
    let mut d = Driver::new(c, 100_000);
    let budget = time_budget(0);
    d.s.set_time_budget(Some(budget));
    d.add(0, 20_000, 2);
    let mut next_id = 1;
    let mut steps = 0;
    let mut skipped_last = false;
    // The quarter at the long prompt's deepest context, beside decodes.
    let floor = budget.cost.tokens_within(20_000, budget.mixed_s / 4.0).min(2048usize.div_ceil(4));
    assert!(floor >= 1);
    while d.s.get(0).is_some_and(|s| s.num_generated() == 0) {
        // Two new short prompts of 300 tokens every step.
        for _ in 0..2 {
            d.add(next_id, 300, 50);
            next_id += 1;
        }
        let before = d.s.get(0).unwrap().num_computed;
        let decoding: Vec<SeqId> = (1..next_id).filter(|id| d.s.get(*id).is_some_and(|s| s.is_decoding())).collect();
        let p = d.step();
        steps += 1;
        let got = chunk_of(&p, 0).map_or(0, |c| c.len);
        if got < floor.min(20_000 - before) {
            assert!(!skipped_last, "step {steps}: the long prompt got {got} < {floor} two steps running");
            skipped_last = true;
        } else {
            skipped_last = false;
        }
        for id in decoding {
            assert!(chunk_of(&p, id).is_some(), "step {steps}: decode {id} starved");
        }
    }
    assert!(steps <= 2 * 20_000usize.div_ceil(floor), "{steps} steps exceed the bound");
}

/// Every running decode has a chunk in every step, whatever prefills wait.
#[test]
fn decodes_are_scheduled_every_step() {
    let mut d = Driver::new(config(64, 256, 16), 10_000);
    for id in 0..4 {
        d.add(id, 10, 40);
    }
    d.step();
    for id in 4..12 {
        d.add(id, 3_000, 3);
    }
    for _ in 0..30 {
        let decoding: Vec<SeqId> = (0..4).filter(|id| d.s.get(*id).is_some_and(|s| s.is_decoding())).collect();
        let p = d.step();
        for id in decoding {
            assert!(chunk_of(&p, id).is_some_and(|c| c.len == 1), "decode {id} skipped");
        }
    }
}

/// A decode-only step (the engine's step-kind decision) gives every decode
/// its token and no prefill its chunk; prefill takes up where it stopped in
/// the next step, and a step with nothing to decode still plans prefill.
#[test]
fn a_decode_only_step_plans_decodes_alone() {
    let mut d = Driver::new(config(64, 256, 16), 10_000);
    d.s.set_decode_only(true);
    d.add(0, 10, 40);
    let first = d.step();
    assert_eq!(chunk_of(&first, 0).map(|c| c.len), Some(10), "nothing decodes yet: prefill goes ahead");
    d.add(1, 3_000, 3);
    for _ in 0..3 {
        let p = d.step();
        assert_eq!(p.chunks, vec![ScheduledChunk { seq_id: 0, start: p.chunks[0].start, len: 1, sample: true }]);
        assert_eq!(d.s.get(1).unwrap().num_computed, 0);
    }
    d.s.set_decode_only(false);
    let p = d.step();
    assert!(chunk_of(&p, 0).is_some_and(|c| c.len == 1));
    assert_eq!(chunk_of(&p, 1).map(|c| (c.start, c.len)), Some((0, 255)));
}

/// A long prompt waiting for the long slot is passed by a short one, and
/// admitted as soon as the long one ahead finishes.
#[test]
fn a_short_prompt_passes_a_long_one_waiting_for_the_long_slot() {
    let mut d = Driver::new(config(64, 1024, 16), 10_000);
    d.add(1, 10_000, 1);
    d.step();
    d.add(2, 10_000, 1);
    d.add(3, 500, 1);
    let p = d.step();
    assert!(chunk_of(&p, 3).is_some(), "the short one went ahead");
    assert!(chunk_of(&p, 2).is_none(), "one long prefill at a time");
    assert!(p.stalled.contains(&(2, Wait::Prefill)));
    while d.s.get(1).is_some() {
        d.step();
    }
    assert!(chunk_of(&d.step(), 2).is_some(), "the second long one starts right after the first");
}

/// Admission holds a prompt back while its blocks and the running
/// sequences' reserve do not fit, instead of admitting and preempting.
#[test]
fn a_prompt_that_does_not_fit_beside_the_reserve_waits() {
    let mut d = Driver::new(config(64, 4096, 16), 100);
    d.add(1, 800, 200); // 50 blocks + 13 reserved for its growth
    d.step();
    d.add(2, 800, 10); // 50 more: 113 > 100
    let p = d.step();
    assert!(chunk_of(&p, 2).is_none());
    assert_eq!(p.admission_blocked, Some(AdmitReason::KvWatermark));
    assert_eq!(p.stalled, vec![(2, Wait::Admission)]);
    d.run_to_end(1_000);
    assert_eq!(d.s.stats().preemptions, 0);
    assert_eq!(d.alloc.num_free(), 100);
}

/// The storm: a pool that holds 5 prompts, 50 arrivals at once.
/// Nothing is recomputed (admission waits instead), everything finishes
/// and every block comes back.
#[test]
fn fifty_arrivals_on_a_pool_for_five_cause_no_recompute_storm() {
    let (prompt, out): (usize, usize) = (1_000, 100);
    let blocks = 5 * (prompt + out).div_ceil(16);
    let mut d = Driver::new(config(64, 2048, 16), blocks);
    for id in 0..50 {
        d.add(id, prompt, out);
    }
    d.run_to_end(100_000);
    let mut finished = d.finished.clone();
    finished.sort();
    assert_eq!(finished, (0..50).collect::<Vec<_>>());
    let st = d.s.stats();
    assert_eq!(st.recomputed_tokens, 0, "{st:?}");
    assert_eq!(d.alloc.num_free(), blocks);
    // Compute was the offered work, no more: prompts plus decodes.
    assert_eq!(d.computed_tokens, 50 * (prompt as u64 + out as u64 - 1));
}

/// Sequences that outgrow the reserve (max_tokens unknown, so only the
/// horizon is reserved) force preemption; the victim is the one with
/// least computed, recompute is counted, and every block comes back.
#[test]
fn preemption_takes_the_least_computed_and_returns_every_block() {
    let mut c = config(64, 256, 4);
    c.growth_reserve_tokens = 4;
    let mut d = Driver::new(c, 24); // 96 tokens
    for id in 0..3 {
        d.add(id, 8 + 4 * id as usize, 30);
    }
    let mut preempted = Vec::new();
    for _ in 0..2_000 {
        if d.s.is_idle() {
            break;
        }
        let computed: HashMap<SeqId, usize> = (0..3).filter_map(|id| d.s.get(id).map(|s| (id, s.num_computed))).collect();
        let p = d.step();
        for v in &p.preempted {
            let least = computed.iter().filter(|(id, _)| d.s.get(**id).is_some()).map(|(_, c)| *c).min().unwrap();
            assert_eq!(computed[v], least, "preempted {v} with {} computed, least was {least}", computed[v]);
            preempted.push(*v);
        }
    }
    assert!(d.s.is_idle());
    assert!(!preempted.is_empty(), "the pool was meant to be too small");
    assert!(d.s.stats().recomputed_tokens > 0);
    assert_eq!(d.s.stats().preemptions, preempted.len() as u64);
    assert_eq!(d.alloc.num_free(), 24);
    assert_eq!(d.finished.len(), 3);
}

/// Under a time budget, a short prompt's cheap first tokens get a larger
/// chunk than a long prompt's tokens deep into its context; every chunk
/// fits the budget; the floor keeps prefill going when the time says none.
#[test]
fn a_time_budget_prices_chunks_by_their_context() {
    let mut d = Driver::new(config(64, 100_000, 16), 100_000);
    let budget = time_budget(0);
    d.s.set_time_budget(Some(budget));
    d.add(1, 60_000, 1);
    // Alone: the long prompt's first chunks fit 2 ms each.
    let mut spent_steps = 0;
    while d.s.get(1).unwrap().num_computed < 40_000 {
        let p = d.step();
        let c = chunk_of(&p, 1).unwrap();
        assert!(budget.cost.seconds(c.start, c.len) <= budget.alone_s + 1e-12);
        spent_steps += 1;
    }
    assert!(spent_steps > 10, "chunks are time-sized, not the whole 100K token cap");
    d.add(2, 3_000, 1); // under the long threshold
    let p = d.step();
    let (long, short) = (chunk_of(&p, 1).unwrap(), chunk_of(&p, 2).unwrap());
    assert!(short.len > long.len, "short {short:?} long {long:?}");
    let total = budget.cost.seconds(long.start, long.len) + budget.cost.seconds(short.start, short.len);
    assert!(total <= budget.alone_s + 1e-9, "{total}");
    // No time at all: the floor still moves 64 tokens.
    let mut f = Driver::new(config(64, 4096, 16), 1_000);
    f.s.set_time_budget(Some(TimeBudget { alone_s: 0.0, mixed_s: 0.0, ..time_budget(64) }));
    f.add(1, 1_000, 1);
    assert_eq!(f.step().prefill_tokens(), 64);
}

/// Blocks pinned by a waiting sequence behind the head (its cache hit, or
/// KV a peer filled) give way when the head needs them and nothing runs:
/// no deadlock with memory held by a sequence that cannot go first.
#[test]
fn blocks_pinned_behind_the_head_give_way_to_it() {
    let mut d = Driver::new(config(8, 64, 4), 10);
    d.add(1, 36, 1); // 9 of the 10 blocks
    let pinned = d.alloc.allocate(6).unwrap();
    d.s.add_seeded(2, vec![2; 24], pinned, 20, false);
    d.max_new.insert(2, 1);
    let p = d.step();
    assert!(chunk_of(&p, 1).is_some(), "the head was admitted: {p:?}");
    d.run_to_end(100);
    assert_eq!(d.finished.len(), 2);
    assert_eq!(d.alloc.num_free(), 10);
}

/// A stand-in for caches beside the pool: the pool and the caches as the
/// one [`KvManager`] the scheduler sees.
struct Kv<'a, C> {
    alloc: &'a mut BlockAllocator,
    caches: &'a mut C,
}

/// Caches whose reused KV for some sequences is still being copied in.
struct Copying(Vec<SeqId>);

impl KvManager for Kv<'_, Copying> {
    fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }
    fn num_free(&self) -> usize {
        self.alloc.num_free()
    }
    fn computed_blocks(&mut self, _seq: &Sequence) -> Option<(Vec<kvc_kv_pool::BlockId>, usize)> {
        None
    }
    fn allocate(&mut self, _seq: SeqId, n: usize) -> Option<Vec<kvc_kv_pool::BlockId>> {
        self.alloc.allocate(n)
    }
    fn free(&mut self, blocks: &[kvc_kv_pool::BlockId]) {
        self.alloc.free_all(blocks);
    }
    fn ready(&mut self, id: SeqId) -> bool {
        !self.caches.0.contains(&id)
    }
}

/// A sequence whose KV is still being copied in is admitted and keeps its
/// place but computes nothing; the others' decodes and prefills go on
/// beside it; it gets its chunk in the first step after its copy is done.
#[test]
fn a_sequence_whose_kv_is_being_copied_in_waits_alone() {
    let mut d = Driver::new(config(64, 4096, 16), 1_000);
    d.add(1, 100, 50);
    d.step(); // 1 prefilled, decoding from now on
    d.add(2, 2_000, 4);
    d.add(3, 300, 4);
    let mut hooks = Copying(vec![2]);
    let p = d.s.schedule(&mut Kv { alloc: &mut d.alloc, caches: &mut hooks });
    assert_eq!(p.copying, vec![2]);
    assert!(chunk_of(&p, 2).is_none(), "no chunk while copying");
    assert_eq!(chunk_of(&p, 1).map(|c| c.len), Some(1), "the decode goes on");
    assert_eq!(chunk_of(&p, 3).map(|c| c.len), Some(300), "another prompt goes on");
    assert!(p.stalled.contains(&(2, Wait::Prefill)));
    for c in &p.chunks {
        d.s.mark_computed(c.seq_id, c.len);
        if c.sample {
            d.s.append_token(c.seq_id, 7);
        }
    }
    // Copied: it is scheduled in the next step.
    hooks.0.clear();
    let p = d.s.schedule(&mut Kv { alloc: &mut d.alloc, caches: &mut hooks });
    assert!(p.copying.is_empty());
    assert_eq!(chunk_of(&p, 2).map(|c| c.start), Some(0));
}

/// A stand-in for the session cache: sequence `id`'s session holds the KV
/// of its first tokens in blocks the cache owns (one allocator reference
/// each). Acquiring hands them over (a new reference) and marks the
/// session busy; releasing clears the mark; reclaim frees the blocks of
/// sessions that are not busy, whoever waits on them.
#[derive(Default)]
struct Sessions {
    held: HashMap<SeqId, Vec<kvc_kv_pool::BlockId>>,
    busy: std::collections::HashSet<SeqId>,
    block_size: usize,
    evicted: usize,
}

impl Sessions {
    fn free_all(&mut self, alloc: &mut BlockAllocator) {
        for (_, b) in self.held.drain() {
            alloc.free_all(&b);
        }
    }
}

impl KvManager for Kv<'_, Sessions> {
    fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }

    fn num_free(&self) -> usize {
        self.alloc.num_free()
    }

    fn allocate(&mut self, _seq: SeqId, n: usize) -> Option<Vec<kvc_kv_pool::BlockId>> {
        if self.alloc.num_free() < n {
            self.reclaim(n);
        }
        self.alloc.allocate(n)
    }

    fn free(&mut self, blocks: &[kvc_kv_pool::BlockId]) {
        self.alloc.free_all(blocks);
    }

    fn reclaim(&mut self, n: usize) {
        let c = &mut *self.caches;
        while self.alloc.num_free() < n {
            let Some(&id) = c.held.keys().filter(|id| !c.busy.contains(id)).min() else { return };
            let blocks = c.held.remove(&id).unwrap();
            c.evicted += blocks.len();
            self.alloc.free_all(&blocks);
        }
    }

    fn computed_blocks(&mut self, seq: &Sequence) -> Option<(Vec<kvc_kv_pool::BlockId>, usize)> {
        let c = &mut *self.caches;
        c.busy.insert(seq.id);
        let blocks = c.held.get(&seq.id).filter(|b| !b.is_empty())?.clone();
        for &b in &blocks {
            self.alloc.incref(b);
        }
        let tokens = blocks.len() * c.block_size;
        Some((blocks, tokens))
    }

    fn release(&mut self, seq: &Sequence) {
        assert!(self.caches.busy.remove(&seq.id), "released without an acquire: {}", seq.id);
    }

    fn resident_blocks(&mut self, seq: &Sequence) -> usize {
        self.caches.held.get(&seq.id).map_or(0, Vec::len)
    }

    fn reclaimable(&mut self) -> usize {
        let c = &*self.caches;
        c.held.iter().filter(|(id, _)| !c.busy.contains(id)).flat_map(|(_, b)| b).filter(|&&b| self.alloc.refcount(b) == 1).count()
    }
}

/// Issue 29's deadlock: sessions whose resident KV fills the pool, each
/// with its next turn waiting. A turn that tried and did not fit used to
/// keep its session busy (unevictable) while it waited, so the pool was
/// held by the very turns that waited for it and the engine parked. Now a
/// turn that does not fit gives its session back (evictable), and every
/// turn finishes, without preemption.
#[test]
fn sessions_that_fill_the_pool_each_with_a_waiting_turn_all_finish() {
    let bs = 4;
    let mut d = Driver::new(config(16, 64, bs), 64);
    let mut cache = Sessions { block_size: bs, ..Default::default() };
    for id in 0..8u64 {
        // Turn 1 left 8 blocks (32 tokens) in the session: 64 in all, the pool.
        cache.held.insert(id, d.alloc.allocate(8).unwrap());
        // Turn 2: the 32 tokens, 8 new ones (10 blocks), 4 to generate.
        d.add(id, 40, 4);
    }
    assert_eq!(d.alloc.num_free(), 0);
    for step in 0..1_000 {
        if d.s.is_idle() {
            break;
        }
        let p = d.step_with(&mut cache);
        assert!(!p.chunks.is_empty(), "step {step}: nothing scheduled with {} waiting", d.s.num_waiting());
        // A waiting turn holds no blocks (it gave back what did not fit).
        assert!(d.s.waiting().all(|w| w.block_table.is_empty()), "step {step}");
    }
    let mut finished = d.finished.clone();
    finished.sort();
    assert_eq!(finished, (0..8).collect::<Vec<_>>());
    assert_eq!(d.s.stats().preemptions, 0);
    assert!(cache.evicted > 0, "sessions were evicted to make room");
    // Busy marks left are those of turns that finished (a commit's, in the engine).
    assert!(cache.busy.iter().all(|id| finished.contains(id)), "{:?}", cache.busy);
    cache.free_all(&mut d.alloc);
    assert_eq!(d.alloc.num_free(), 64, "every block is back");
}

/// The head-of-line bound (planner module doc): a prompt held back for
/// memory is passed by smaller ones only in its first K steps of waiting;
/// from then on nothing is admitted before it, and it is admitted within
/// K + R steps, R the steps the sequences running at step K need to end.
#[test]
fn smaller_prompts_pass_a_waiting_large_one_only_within_the_bound() {
    const K: usize = 3;
    let mut c = config(64, 4096, 4);
    c.max_head_of_line_steps = K;
    c.growth_reserve_tokens = 8;
    let mut d = Driver::new(c, 100);
    d.add(1, 40, 20); // 10 blocks, runs 20 steps
    d.step();
    d.add(2, 360, 2); // 90 blocks: does not fit beside 1 and its reserve
    let mut admitted_at: HashMap<SeqId, usize> = HashMap::new();
    let mut next = 100;
    let mut head_admitted = None;
    for step in 1..200 {
        // A small prompt arrives every step.
        d.add(next, 4, 6);
        next += 1;
        let p = d.step();
        for c in p.chunks.iter().filter(|c| c.start == 0) {
            admitted_at.insert(c.seq_id, step);
        }
        if chunk_of(&p, 2).is_some() {
            head_admitted = Some(step);
            break;
        }
    }
    let head = head_admitted.expect("the large prompt was admitted");
    // Small prompts admitted before the large one (those of its own step
    // were admitted after it, in order).
    let passers: Vec<usize> = admitted_at.iter().filter(|(id, s)| **id >= 100 && **s < head).map(|(_, s)| *s).collect();
    assert!(!passers.is_empty(), "small prompts passed the large one while it waited");
    assert!(passers.iter().all(|&s| s <= K), "admitted past the head after its first {K} steps: {passers:?}");
    // Running at step K: seq 1 (20 decodes from step 1) and the passers
    // (6 tokens each): R <= 20.
    assert!(head <= K + 20, "the head waited {head} steps");
    d.run_to_end(10_000);
    assert_eq!(d.alloc.num_free(), 100);
}

/// With K = 0 the queue is strict arrival order for memory (vLLM's FCFS).
#[test]
fn with_no_head_of_line_steps_nothing_passes_a_prompt_waiting_for_memory() {
    let mut c = config(64, 4096, 4);
    c.growth_reserve_tokens = 8;
    let mut d = Driver::new(c, 100);
    d.add(1, 40, 20);
    d.step();
    d.add(2, 360, 2);
    d.add(3, 4, 2);
    let p = d.step();
    assert!(chunk_of(&p, 2).is_none() && chunk_of(&p, 3).is_none(), "{p:?}");
    assert_eq!(p.head_of_line, Some((2, 1)));
    loop {
        let p = d.step();
        if let Some(c) = chunk_of(&p, 3) {
            assert!(d.s.get(2).is_none_or(|s| s.num_computed > 0) || chunk_of(&p, 2).is_some(), "3 went before 2: {c:?}");
            break;
        }
    }
    d.run_to_end(10_000);
    assert_eq!(d.alloc.num_free(), 100);
}

/// A prefill running alone is chunked by the step-time budget, unless the
/// queue waits for memory that prefill holds: then it takes the token cap,
/// so that the memory comes back sooner (no decode's next token and no
/// new prompt's first chunk is in the way).
#[test]
fn a_lone_prefill_holding_the_memory_the_queue_waits_for_takes_the_token_cap() {
    let chunk = |blocked: bool| {
        let mut d = Driver::new(config(64, 4096, 16), 300);
        d.s.set_time_budget(Some(time_budget(0)));
        d.add(1, 4_000, 2); // 250 blocks
        let first = d.step();
        if blocked {
            d.add(2, 1_600, 2); // 100 blocks: waits for 1's
        }
        let p = d.step();
        assert_eq!(p.admission_blocked.is_some(), blocked);
        (chunk_of(&first, 1).unwrap().len, chunk_of(&p, 1).unwrap().len)
    };
    let (first, alone) = chunk(false);
    assert!(first < 4_000 && alone < 4_000 - first, "the budget chunks a lone prefill: {first} {alone}");
    let (_, blocked) = chunk(true);
    assert_eq!(blocked, (4_000 - first).min(4096), "with the queue waiting for its memory, the token cap");
}

/// A step whose decodes take all of `max_num_batched_tokens` carries no
/// prefill, a long one's "at least one token" included: no step exceeds
/// the token cap, and the long prompt goes on once the decodes leave room.
#[test]
fn decodes_that_take_the_whole_token_cap_leave_a_long_prefill_waiting() {
    let mut c = config(8, 2, 4);
    c.long_prefill_token_threshold = 4;
    let mut d = Driver::new(c, 100);
    d.add(1, 20, 1); // long
    d.step();
    d.add(2, 1, 3);
    d.add(3, 1, 3);
    let mut full = 0;
    for _ in 0..30 {
        if d.s.is_idle() {
            break;
        }
        let decoding = [2, 3].iter().filter(|id| d.s.get(**id).is_some_and(|s| s.is_decoding())).count();
        let p = d.step();
        assert!(p.chunks.iter().map(|c| c.len).sum::<usize>() <= 2, "{:?} exceeds the token cap", p.chunks);
        if decoding == 2 {
            full += 1;
            assert_eq!(p.decodes, 2);
            assert!(chunk_of(&p, 1).is_none(), "the long prefill has no token left in the step: {:?}", p.chunks);
        }
    }
    assert!(full >= 1, "some step's decodes took the whole cap");
    assert!(d.s.is_idle() && d.finished.contains(&1), "the long prompt finished");
}
