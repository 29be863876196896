//! Pass 2 of the step planner ([`Scheduler::schedule`]): admission in
//! arrival order, with the liveness rules and the head-of-line bound that
//! the planner's module doc states.
//!
//! A waiting sequence is first judged on what it could have without side
//! effects: its blocks, less those its caches hold on the device for it
//! ([`KvManager::resident_blocks`]), against the free blocks plus all
//! that could be freed (cached KV, [`KvManager::reclaimable`], and
//! the blocks other waiting sequences hold). Only a sequence that can fit
//! acquires its reusable KV (pinning it, copying host-tier blocks back) and
//! has caches reclaimed for it; one that then still does not fit gives
//! everything back at once. So no waiting sequence keeps blocks it cannot
//! use, and KV is never evicted for a sequence that could not be admitted.

use kvc_policy::seq_admission::{decide_seq_admission, AdmitInputs, AdmitReason};

use super::{Schedule, Scheduler};
use crate::kv_manager::KvManager;
use crate::sequence::{SeqId, SeqStatus};

impl Scheduler {
    /// Pass 2 of [`Self::schedule`]: admits waiting sequences in order.
    /// Marks those passed over for a long slot with `long_prefill` (so
    /// their wait counts as behind other prefills).
    pub(super) fn admit(&mut self, kv: &mut dyn KvManager, budget: usize, out: &mut Schedule) {
        let capacity_tokens = kv.num_blocks() * self.config.block_size;
        let mut partial = self.running.iter().filter(|id| !self.seqs[id].is_decoding()).count();
        let mut long_partial = self.running.iter().filter(|id| !self.seqs[id].is_decoding() && self.seqs[id].long_prefill).count();
        // The oldest sequence held back for memory in this pass: the head
        // of the line, which younger ones may pass only within the bound.
        let mut head: Option<SeqId> = None;
        let mut reclaimable: Option<usize> = None;
        let mut i = 0;
        while i < self.waiting.len() {
            let id = self.waiting[i];
            if self.seqs[&id].tokens.len() + 1 > capacity_tokens {
                self.waiting.remove(i);
                out.unfittable.push(id);
                continue;
            }
            let mut inputs = AdmitInputs {
                running: self.running.len(),
                max_num_seqs: self.config.max_num_seqs,
                partial_prefills: partial,
                max_num_partial_prefills: self.config.max_num_partial_prefills.max(1),
                long_partial_prefills: long_partial,
                max_long_partial_prefills: self.config.max_long_partial_prefills.max(1),
                is_long: false,
                budget_left: budget,
                need_blocks: 0,
                free_blocks: usize::MAX,
                reserve_blocks: 0,
            };
            let reason = decide_seq_admission(&inputs);
            if reason != AdmitReason::Admitted {
                out.admission_blocked.get_or_insert(reason);
                break;
            }
            let passing = head.is_some();
            if head.is_some_and(|h| !self.may_pass(h)) {
                break;
            }
            // Younger sequences than a passer keep their blocks for it.
            let release_from = if passing { i + 1 } else { 0 };
            if !self.seqs[&id].acquired && !self.could_fit(id, release_from, kv, &mut reclaimable) {
                out.admission_blocked.get_or_insert(AdmitReason::KvWatermark);
                head.get_or_insert(id);
                i += 1;
                continue;
            }
            if !self.seqs[&id].acquired {
                let found = kv.computed_blocks(&self.seqs[&id]);
                let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
                seq.acquired = true;
                if let Some((blocks, tokens)) = found {
                    debug_assert!(seq.block_table.is_empty() && tokens < seq.tokens.len());
                    seq.block_table = blocks;
                    seq.num_computed = tokens;
                }
                // Acquiring may have moved KV (host-tier restores).
                reclaimable = None;
            }
            let seq = &self.seqs[&id];
            inputs.is_long = seq.remaining() > self.config.long_prefill_token_threshold;
            inputs.need_blocks = self.missing_blocks(id, seq.tokens.len());
            inputs.reserve_blocks = self.growth_reserve();
            inputs.free_blocks = kv.num_free();
            let mut reason = decide_seq_admission(&inputs);
            // Only memory is missing: reclaim caches for it (never for a
            // sequence a slot limit holds back anyway), then blocks that
            // other waiting sequences hold.
            while reason == AdmitReason::KvWatermark {
                kv.reclaim(inputs.need_blocks + inputs.reserve_blocks);
                reclaimable = None;
                inputs.free_blocks = kv.num_free();
                reason = decide_seq_admission(&inputs);
                if reason == AdmitReason::KvWatermark && !self.release_one_waiting(Some(id), release_from, kv) {
                    break;
                }
            }
            tracing::debug!(
                event = "admission",
                seq_id = id,
                reason = reason.as_str(),
                need = inputs.need_blocks,
                reserve = inputs.reserve_blocks,
                free = inputs.free_blocks,
                passing
            );
            match reason {
                AdmitReason::Admitted => {}
                AdmitReason::LongPartialPrefills => {
                    // Shorter prompts behind it may go first.
                    self.seqs.get_mut(&id).expect("waiting sequence exists").long_prefill = true;
                    out.admission_blocked.get_or_insert(reason);
                    i += 1;
                    continue;
                }
                AdmitReason::KvWatermark => {
                    // It keeps nothing it cannot use while it waits.
                    self.give_back_blocks(id, kv);
                    out.admission_blocked.get_or_insert(reason);
                    head.get_or_insert(id);
                    i += 1;
                    continue;
                }
                _ => {
                    out.admission_blocked.get_or_insert(reason);
                    break;
                }
            }
            let need = inputs.need_blocks;
            let blocks = kv.allocate(id, need).expect("blocks were counted as free");
            self.waiting.remove(i);
            let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
            seq.block_table.extend(blocks);
            seq.status = SeqStatus::Running;
            seq.long_prefill = inputs.is_long;
            self.running.push(id);
            self.running.sort_by_key(|r| self.seqs[r].arrival);
            *self.stats.admissions.entry(AdmitReason::Admitted).or_default() += 1;
            kvc_policy::log_decision(&AdmitReason::Admitted.decision(&inputs));
            if passing {
                self.stats.passed_head += 1;
            }
            partial += 1;
            long_partial += usize::from(inputs.is_long);
        }
        self.head_wait = match (head, self.head_wait) {
            (Some(h), Some((w, steps))) if h == w => Some((h, steps + 1)),
            (Some(h), _) => Some((h, 1)),
            (None, _) => None,
        };
        out.head_of_line = self.head_wait;
    }

    /// Whether a sequence may still be admitted past `head`, the head of
    /// the line: only in the first `max_head_of_line_steps` steps in which
    /// the head waits for memory (this one counted).
    fn may_pass(&self, head: SeqId) -> bool {
        let waited = match self.head_wait {
            Some((h, steps)) if h == head => steps + 1,
            _ => 1,
        };
        waited <= self.config.max_head_of_line_steps
    }

    /// Whether waiting sequence `id` could fit beside the growth reserve
    /// if every block that can be freed were: free blocks, what the caches
    /// could reclaim (`reclaimable`, computed once and kept until the
    /// caches change), and the blocks of waiting sequences from position
    /// `release_from` on. Counts the blocks its caches hold on the device
    /// as its own. No side effects.
    fn could_fit(&self, id: SeqId, release_from: usize, kv: &mut dyn KvManager, reclaimable: &mut Option<usize>) -> bool {
        let seq = &self.seqs[&id];
        let need = seq.tokens.len().div_ceil(self.config.block_size).saturating_sub(kv.resident_blocks(seq));
        let others: usize = self.waiting.iter().skip(release_from).filter(|&&w| w != id).map(|w| self.seqs[w].block_table.len()).sum();
        let freeable = kv.num_free() + *reclaimable.get_or_insert_with(|| kv.reclaimable()) + others;
        need + self.growth_reserve() <= freeable
    }
}
