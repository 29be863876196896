//! The step planner.
//!
//! A step is planned in three passes:
//!
//! 1. **Decodes.** Every running sequence with one token to compute gets
//!    it, every step. One that needs a block and finds none first has the
//!    caches reclaimed (prefix index, idle sessions: demoted to the host
//!    tier where there is one), then releases blocks held by waiting
//!    sequences, and only then preempts the running sequence whose loss
//!    wastes least ([`decide_preemption`], in kvc-policy); that one is
//!    recomputed later.
//! 2. **Admission**
//!    ([`decide_seq_admission`](kvc_policy::seq_admission::decide_seq_admission),
//!    in kvc-policy), in arrival order: a waiting sequence is admitted when a sequence slot and a prefill slot are
//!    free and the blocks for its *whole* token list fit beside a reserve
//!    for the running sequences' growth. Admitted prompts hold all their
//!    blocks, so prefill chunks never need memory and never preempt:
//!    excess load waits in the queue instead of thrashing. A long prompt
//!    that finds the long-prefill slots taken is passed by shorter ones
//!    behind it; one that does not fit in memory is passed only within
//!    the head-of-line bound below. Liveness rules (admit.rs): a waiting
//!    sequence that cannot fit keeps no blocks (its reusable KV stays in
//!    the caches, evictable like any other), caches are reclaimed only for
//!    a sequence that then fits, and the cached KV in its way (other
//!    sessions', prefixes, other waiting sequences' blocks) goes until it
//!    does.
//!
//! **Liveness.** When nothing runs, the oldest waiting sequence is
//! admitted in the same step unless blocks held outside the scheduler's
//! reach (KV transfers in flight) are in its way: every other block is
//! either free or cached, and caches give way. A prompt that could never
//! fit (more tokens than the pool) is answered at once (`unfittable`);
//! the engine refuses such prompts before they are queued.
//!
//! **Head-of-line bound.** Let `K` be `max_head_of_line_steps`. Younger
//! sequences may be admitted past the oldest sequence held back for
//! memory (the head) only in the first `K` steps in which it is held
//! back; from then on none is, so the running set only shrinks and grows
//! by the head's own turn: the head is admitted in the first step in
//! which its blocks fit beside the growth reserve of what still runs,
//! that is within `K + R` steps of becoming the head, `R` being the steps
//! the sequences running at step `K` need to finish (each at most its
//! remaining prefill steps plus `max_new_tokens` decodes).
//! 3. **Prefill chunks.** Short prefills first (oldest first), then long
//!    ones (at most `max_long_partial_prefills`), within the step's
//!    [`StepBudget`]: what the decodes leave of `max_num_batched_tokens`,
//!    and the engine's step-time budget ([`TimeBudget`]: seconds of
//!    prefill, more when nothing decodes than beside decodes, priced per
//!    chunk by the context it attends to). A
//!    step with no decodes while the queue waits for memory takes the
//!    token cap alone: the prefills in flight hold what the queue waits
//!    for, and a shorter step would serve nobody. A step the engine
//!    makes decode-only ([`Scheduler::set_decode_only`]; at most a few in
//!    a row, then a step with prefill: `kvc_policy::step_kind`) plans no
//!    chunk while anything decodes; the bounds below count the steps
//!    that carry prefill.
//!
//! **Progress bound for long prompts.** The oldest running long prefill
//! is given, before short prefills take the rest, the tokens that fit in
//! a quarter of the step's prefill budget, of its tokens (`ceil(B / 4)`,
//! `B` = `max_num_batched_tokens` less the step's decodes) and of its time
//! budget, and never fewer than 1 (or what it has left, or none in a step
//! whose decodes take all of `max_num_batched_tokens`); it is given that
//! in every step but one kind: a step in which a short prompt's prefill
//! finishes gives the long prefills nothing, unless the step before gave
//! them nothing too. So the oldest long prefill gets its quarter in at
//! least one of any two consecutive steps. With a time budget of `T`
//! seconds and the measured cost per token at context `c` of `a + b c`, a
//! long prompt of `L` tokens finishes within
//! `2 ceil(L / min(ceil(B / 4), n))` steps of becoming the oldest long
//! prefill, `n >= 1` being the tokens whose chunk at its deepest context
//! costs `T / 4` (and within `ceil(L / min(ceil(B / 4), n)) + k` steps when
//! `k` short prompts finish meanwhile); a long prompt waiting for a long
//! slot gets it as soon as the long prefills ahead of it finish.
//!
//! **Short prompts' first tokens.** The step in which a short prompt's
//! prefill finishes carries no long chunk (above), so the first token
//! comes after the step in flight and one step as short as the short
//! prompts' own work.

use std::collections::{BTreeMap, HashMap, VecDeque};

use kvc_kv_pool::BlockId;

use crate::config::SchedulerConfig;
use crate::kv_manager::KvManager;
use crate::sequence::{SeqId, SeqStatus, Sequence};
use crate::step_budget::{StepBudget, TimeBudget};
use kvc_policy::preemption::{decide_preemption, PreemptionCandidate};
use kvc_policy::seq_admission::{AdmitReason, Wait};

mod admit;
mod prefill_plan;
mod update;

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

impl ScheduledChunk {
    /// Whether this chunk is a decode: the one token of a sequence that has
    /// one left to compute ([`Sequence::is_decoding`] when it was planned),
    /// sampled. The one definition, for the scheduler and the engine alike.
    pub fn is_decode(&self) -> bool {
        self.len == 1 && self.sample
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub chunks: Vec<ScheduledChunk>,
    /// Sequences preempted while planning this step (freed, re-queued).
    pub preempted: Vec<SeqId>,
    /// Sequences that can never fit in the pool, even alone; the caller
    /// must finish them (they hold no blocks any more).
    pub unfittable: Vec<SeqId>,
    /// Why the first waiting sequence left waiting was not admitted.
    pub admission_blocked: Option<AdmitReason>,
    /// Sequences with no chunk this step that have not produced a token
    /// since their (re)admission began, and what they wait for.
    pub stalled: Vec<(SeqId, Wait)>,
    /// Chunks of one token (decodes) among `chunks`.
    pub decodes: usize,
    /// Running sequences left out of this step because their reused KV is
    /// still being copied in ([`KvManager::ready`]).
    pub copying: Vec<SeqId>,
    /// The oldest waiting sequence held back for memory, and the steps in
    /// a row it has been (younger ones pass it only in the first
    /// `max_head_of_line_steps`).
    pub head_of_line: Option<(SeqId, usize)>,
}

impl Schedule {
    /// Tokens of prefill chunks (everything but decodes).
    pub fn prefill_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum::<usize>() - self.decodes
    }

    /// The decodes among `chunks` ([`ScheduledChunk::is_decode`]).
    pub fn decode_chunks(&self) -> impl Iterator<Item = &ScheduledChunk> {
        self.chunks.iter().filter(|c| c.is_decode())
    }

    /// The prefill chunks among `chunks` (all but decodes).
    pub fn prefill_chunks(&self) -> impl Iterator<Item = &ScheduledChunk> {
        self.chunks.iter().filter(|c| !c.is_decode())
    }

    /// The decoding sequences' context lengths, summed.
    pub fn decode_context(&self) -> usize {
        self.decode_chunks().map(|c| c.start + 1).sum()
    }
}

/// Counters since start.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SchedulerStats {
    pub preemptions: u64,
    /// Tokens computed again after their KV was lost to preemption.
    pub recomputed_tokens: u64,
    /// Admission decisions by reason: one per admitted sequence, and one
    /// per step for the sequence at the head of what is left waiting.
    pub admissions: BTreeMap<AdmitReason, u64>,
    /// Sequences admitted past an older one held back for memory.
    pub passed_head: u64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    seqs: HashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    /// In arrival order.
    running: Vec<SeqId>,
    next_arrival: u64,
    /// Each step's budget as the engine set it: `max_num_batched_tokens`
    /// and the seconds of prefill a step may carry (none: tokens only).
    budget: StepBudget,
    /// The next step runs its decodes alone (the engine's step-kind
    /// decision); a step without decodes plans prefill regardless.
    decode_only: bool,
    /// The last step gave the long prefills nothing for a short prompt's
    /// first token (so this one gives them their quarter).
    long_skipped: bool,
    /// The head of the line (oldest sequence held back for memory) and
    /// the steps in a row it has been.
    head_wait: Option<(SeqId, usize)>,
    stats: SchedulerStats,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            budget: StepBudget::new(config.max_num_batched_tokens, None),
            decode_only: false,
            long_skipped: false,
            head_wait: None,
            config,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
            stats: SchedulerStats::default(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// The budget of the next steps, the engine's (built once per step
    /// from its step-budget decision); each step spends a copy.
    pub fn set_step_budget(&mut self, budget: StepBudget) {
        self.budget = budget;
    }

    /// [`Self::set_step_budget`] with `max_num_batched_tokens` and this
    /// step-time budget for prefill chunks (None: only the token cap
    /// limits them).
    pub fn set_time_budget(&mut self, budget: Option<TimeBudget>) {
        self.set_step_budget(StepBudget::new(self.config.max_num_batched_tokens, budget));
    }

    /// Whether the next steps run their decodes alone, planning no prefill
    /// chunk (steps with nothing to decode plan prefill all the same).
    pub fn set_decode_only(&mut self, decode_only: bool) {
        self.decode_only = decode_only;
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

    /// Caps the tokens `id` may still generate (its request's `max_tokens`),
    /// which bounds the growth reserved for it.
    pub fn set_max_new_tokens(&mut self, id: SeqId, n: usize) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.max_new_tokens = n;
        }
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

    /// Running sequences decoding, and the sum of their context lengths
    /// (what the next step's decodes will cost).
    pub fn decode_load(&self) -> (usize, usize) {
        self.running.iter().map(|id| &self.seqs[id]).filter(|s| s.is_decoding()).fold((0, 0), |(n, c), s| (n + 1, c + s.tokens.len()))
    }

    /// Running sequences still computing their prompt.
    pub fn num_partial_prefills(&self) -> usize {
        self.running.iter().filter(|id| !self.seqs[id].is_decoding()).count()
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
        self.stats.preemptions
    }

    /// Records that `len` more tokens of `id` now have KV in the pool.
    pub fn mark_computed(&mut self, id: SeqId, len: usize) {
        if let Some(s) = self.seqs.get_mut(&id) {
            let again = (s.num_computed + len).min(s.recompute_until).saturating_sub(s.num_computed);
            self.stats.recomputed_tokens += again as u64;
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
    pub fn remove(&mut self, id: SeqId, kv: &mut dyn KvManager) -> Option<Sequence> {
        let seq = self.seqs.remove(&id)?;
        kv.free(&seq.block_table);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        Some(seq)
    }

    /// Waiting sequences in admission order.
    pub fn waiting(&self) -> impl Iterator<Item = &Sequence> {
        self.waiting.iter().map(|id| &self.seqs[id])
    }

    /// Blocks `id` lacks for its first `tokens` tokens.
    fn missing_blocks(&self, id: SeqId, tokens: usize) -> usize {
        tokens.div_ceil(self.config.block_size).saturating_sub(self.seqs[&id].block_table.len())
    }

    /// Makes sure `id` has blocks for its first `tokens` tokens, asking
    /// the caches for cached KV when the pool is short.
    fn grow(&mut self, id: SeqId, tokens: usize, kv: &mut dyn KvManager) -> bool {
        let need = self.missing_blocks(id, tokens);
        if need == 0 {
            return true;
        }
        match kv.allocate(id, need) {
            Some(blocks) => {
                self.seqs.get_mut(&id).expect("scheduled sequence exists").block_table.extend(blocks);
                true
            }
            None => false,
        }
    }

    /// Blocks for `id`'s first `tokens` tokens, by reclaiming caches, then
    /// releasing waiting sequences' blocks, then preempting. False when
    /// `id` itself was preempted.
    fn ensure_blocks(&mut self, id: SeqId, tokens: usize, kv: &mut dyn KvManager, out: &mut Schedule) -> bool {
        while !self.grow(id, tokens, kv) {
            if self.release_one_waiting(None, 0, kv) {
                continue;
            }
            let candidates: Vec<PreemptionCandidate> = self
                .running
                .iter()
                .map(|r| {
                    let s = &self.seqs[r];
                    PreemptionCandidate { id: *r, computed: s.num_computed, arrival: s.arrival }
                })
                .collect();
            let decision = decide_preemption(&candidates).expect("`id` itself is running");
            let victim = decision.victim;
            kvc_policy::log_decision(&decision.decision());
            tracing::debug!(
                event = "preempt",
                seq_id = victim,
                reason = decision.reason.as_str(),
                for_seq = id,
                "preempted sequence for recompute"
            );
            self.preempt(victim, kv);
            out.preempted.push(victim);
            if victim == id {
                return false;
            }
        }
        true
    }

    fn preempt(&mut self, id: SeqId, kv: &mut dyn KvManager) {
        let seq = self.seqs.get_mut(&id).expect("preempted sequence exists");
        seq.recompute_until = seq.recompute_until.max(seq.num_computed);
        self.give_back_blocks(id, kv);
        let seq = self.seqs.get_mut(&id).expect("preempted sequence exists");
        seq.long_prefill = false;
        seq.status = SeqStatus::Waiting;
        seq.preemptions += 1;
        self.stats.preemptions += 1;
        self.running.retain(|&r| r != id);
        // Back to the front: it is older than everything still waiting.
        self.waiting.push_front(id);
    }

    /// Frees `id`'s blocks and forgets what it computed and acquired (the
    /// caches release their marks); it looks them up again when admitted.
    fn give_back_blocks(&mut self, id: SeqId, kv: &mut dyn KvManager) {
        let seq = self.seqs.get_mut(&id).expect("sequence exists");
        kv.free(&seq.block_table);
        seq.block_table.clear();
        seq.num_computed = 0;
        if std::mem::replace(&mut seq.acquired, false) {
            kv.release(&self.seqs[&id]);
        }
    }

    /// Releases the blocks of one waiting sequence other than `except`,
    /// among those at queue position `from` or later, the last in the
    /// queue first (it acquires again when admitted). True if one had any.
    fn release_one_waiting(&mut self, except: Option<SeqId>, from: usize, kv: &mut dyn KvManager) -> bool {
        let Some(&id) = self.waiting.iter().skip(from).rev().find(|&&id| Some(id) != except && !self.seqs[&id].block_table.is_empty())
        else {
            return false;
        };
        self.give_back_blocks(id, kv);
        true
    }

    /// Blocks kept free at admission for the running sequences' growth:
    /// the watermark plus, for each, the blocks of its next
    /// `growth_reserve_tokens` tokens (fewer when `max_new_tokens` ends
    /// it sooner). Nothing when nothing runs: a prompt alone may fill the pool.
    fn growth_reserve(&self) -> usize {
        if self.running.is_empty() {
            return 0;
        }
        let bs = self.config.block_size;
        let growth: usize = self
            .running
            .iter()
            .map(|id| {
                let s = &self.seqs[id];
                let more = s.max_new_tokens.saturating_sub(s.num_generated()).min(self.config.growth_reserve_tokens);
                (s.tokens.len() + more).div_ceil(bs).saturating_sub(s.block_table.len())
            })
            .sum();
        self.config.watermark_blocks + growth
    }

    /// Plans one step.
    pub fn schedule(&mut self, kv: &mut dyn KvManager) -> Schedule {
        let mut out = Schedule::default();
        let mut budget = self.budget;
        let capacity_tokens = kv.num_blocks() * self.config.block_size;

        // 1. Decodes, oldest first.
        let decoding: Vec<SeqId> = self.running.iter().copied().filter(|id| self.seqs[id].is_decoding()).collect();
        for id in decoding {
            if self.seqs[&id].status != SeqStatus::Running || out.chunks.len() >= budget.tokens_left() {
                continue;
            }
            let end = self.seqs[&id].num_computed + 1;
            if end > capacity_tokens {
                self.preempt(id, kv);
                self.waiting.retain(|&w| w != id);
                out.unfittable.push(id);
                continue;
            }
            if self.ensure_blocks(id, end, kv, &mut out) {
                out.chunks.push(ScheduledChunk { seq_id: id, start: end - 1, len: 1, sample: true });
            }
        }
        // A decode planned before a later preemption may belong to a victim.
        out.chunks.retain(|c| self.seqs[&c.seq_id].status == SeqStatus::Running);
        out.decodes = out.chunks.len();
        budget.spend_decodes(out.decodes);
        // 2. Admission. None while memory is short: that would only thrash.
        if out.preempted.is_empty() {
            self.admit(kv, budget.tokens_left(), &mut out);
        } else if !self.waiting.is_empty() {
            out.admission_blocked = Some(AdmitReason::KvWatermark);
        }
        if let Some(reason) = out.admission_blocked {
            *self.stats.admissions.entry(reason).or_default() += 1;
            kvc_policy::log_decision(&kvc_policy::Decision::new("wait", reason));
        }

        // 3. Prefill chunks, for the sequences whose reused KV is in place.
        out.copying = self.running.iter().copied().filter(|id| !self.seqs[id].is_decoding() && !kv.ready(*id)).collect();
        // Nothing decodes and the queue waits for memory: a step shorter
        // than the token cap would serve nobody (no answer's next token;
        // a new prompt could at best pass the one held back), while the
        // prefills in flight hold the memory the queue waits for. They go
        // at the token cap, not the step-time budget.
        let memory_bound = out.decodes == 0 && out.admission_blocked == Some(AdmitReason::KvWatermark);
        let budget = if memory_bound { budget.without_time() } else { budget };
        let planned = if self.decode_only && out.decodes > 0 {
            Vec::new()
        } else {
            let (planned, long_skipped) = self.plan_prefill_chunks(budget, &out.copying);
            self.long_skipped = long_skipped;
            planned
        };
        for (id, len) in planned {
            let start = self.seqs[&id].num_computed;
            // Admission reserved the whole token list; this only guards it.
            if !self.ensure_blocks(id, start + len, kv, &mut out) {
                continue;
            }
            let sample = start + len == self.seqs[&id].tokens.len();
            out.chunks.push(ScheduledChunk { seq_id: id, start, len, sample });
        }
        out.chunks.retain(|c| self.seqs[&c.seq_id].status == SeqStatus::Running);
        out.decodes = out.decode_chunks().count();

        // Who waits, and for what.
        let scheduled: std::collections::HashSet<SeqId> = out.chunks.iter().map(|c| c.seq_id).collect();
        for id in self.running.iter().filter(|id| !scheduled.contains(id) && !self.seqs[id].is_decoding()) {
            out.stalled.push((*id, Wait::Prefill));
        }
        let head_wait = out.admission_blocked.map_or(Wait::Prefill, AdmitReason::wait);
        for id in &self.waiting {
            let wait = if self.seqs[id].long_prefill { Wait::Prefill } else { head_wait };
            out.stalled.push((*id, wait));
        }
        out
    }
}
