//! Pass 3 of the step planner ([`Scheduler::schedule`]): which running
//! prefills get how many tokens, within the step's [`StepBudget`] (its
//! token cap and step-time budget), with the long prompts' progress bound and short prompts' first
//! tokens as the module doc of the planner states them.

use super::Scheduler;
use crate::sequence::SeqId;
use crate::step_budget::StepBudget;

impl Scheduler {
    /// Pass 3 of [`Self::schedule`]: (sequence, chunk length) for the
    /// running prefills but those whose KV is still `copying` in, and
    /// whether the long ones were skipped for a
    /// short prompt's first token. Short ones first (oldest first), then at
    /// most `max_long_partial_prefills` long ones; the oldest long one is
    /// first given its [`StepBudget::share`] (a quarter of the step's
    /// tokens and time, or what it has left), except in a step where a
    /// short prefill finishes and the last step did not skip them (module
    /// doc). Within `budget`, the step's after its decodes; at least its
    /// [`StepBudget::floor`] in all when anything is left.
    pub(super) fn plan_prefill_chunks(&self, budget: StepBudget, copying: &[SeqId]) -> (Vec<(SeqId, usize)>, bool) {
        let prefilling: Vec<SeqId> =
            self.running.iter().copied().filter(|id| !self.seqs[id].is_decoding() && !copying.contains(id)).collect();
        let (long, short): (Vec<SeqId>, Vec<SeqId>) = prefilling.iter().partition(|id| self.seqs[id].long_prefill);
        if !long.is_empty() && !self.long_skipped {
            let (lens, short_finishes) = self.plan_chunks(&short, &long, budget, true);
            if short_finishes {
                return (lens, true);
            }
        }
        (self.plan_chunks(&short, &long, budget, false).0, false)
    }

    /// [`Self::plan_prefill_chunks`] for one choice: with `skip_long`, the
    /// long prefills get nothing (but the floor). Also says whether a
    /// short prefill finishes in the step.
    fn plan_chunks(&self, short: &[SeqId], long: &[SeqId], mut budget: StepBudget, skip_long: bool) -> (Vec<(SeqId, usize)>, bool) {
        let long_slots = self.config.max_long_partial_prefills.max(1);
        let order: Vec<SeqId> = short.iter().chain(long.iter().take(long_slots)).copied().collect();
        let floor = budget.floor();
        // Where `id`'s next chunk starts, `done` of its tokens planned
        // already, and how many it has left.
        let at = |id: SeqId, done: usize| {
            let s = &self.seqs[&id];
            (s.num_computed + done, s.remaining() - done)
        };
        let mut lens: Vec<usize> = vec![0; order.len()];
        // The oldest long prefill's share comes off the top.
        if let Some(&first_long) = long.first().filter(|_| !skip_long) {
            let i = short.len();
            let (start, left) = at(first_long, 0);
            lens[i] = budget.share(start, left);
            budget.spend(start, lens[i]);
        }
        // Then in order: shorts, the oldest long's top-up, other longs;
        // no top-up in a step where a short prompt finishes: that step
        // yields a first token, so it stays as short as its work.
        let short_finishes = |lens: &[usize]| (0..short.len()).any(|j| lens[j] > 0 && lens[j] == self.seqs[&order[j]].remaining());
        for (i, &id) in order.iter().enumerate() {
            if i >= short.len() && (skip_long || short_finishes(&lens)) {
                break;
            }
            let (start, left) = at(id, lens[i]);
            let more = budget.fit(start, left);
            budget.spend(start, more);
            lens[i] += more;
        }
        let finishes = short_finishes(&lens);
        // The floor: at least `floor` tokens in all, in the same order.
        let mut short_of = floor.saturating_sub(lens.iter().sum());
        for (i, &id) in order.iter().enumerate() {
            if short_of == 0 {
                break;
            }
            let more = budget.spend_tokens(short_of.min(at(id, lens[i]).1));
            lens[i] += more;
            short_of -= more;
        }
        (order.into_iter().zip(lens).filter(|(_, len)| *len > 0).collect(), finishes)
    }
}
