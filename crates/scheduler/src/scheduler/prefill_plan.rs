//! Pass 3 of the step planner ([`Scheduler::schedule`]): which running
//! prefills get how many tokens, within the token cap and the step-time
//! budget, with the long prompts' progress bound and short prompts' first
//! tokens as the module doc of the planner states them.

use super::Scheduler;
use crate::budget::TimeBudget;
use crate::sequence::SeqId;

impl Scheduler {
    /// Pass 3 of [`Self::schedule`]: (sequence, chunk length) for the
    /// running prefills but those whose KV is still `copying` in, and
    /// whether the long ones were skipped for a
    /// short prompt's first token. Short ones first (oldest first), then at
    /// most `max_long_partial_prefills` long ones; the oldest long one is
    /// first given a quarter of the step (of its tokens and of its time) or
    /// what it has left, except in a step where a short prefill finishes
    /// and the last step did not skip them (module doc). Within
    /// `token_cap` tokens and the time budget (alone or beside decodes); at
    /// least `min_tokens` in all when anything is left. `time_budget`: the
    /// step's (None: the token cap only).
    pub(super) fn plan_prefill_chunks(
        &self,
        token_cap: usize,
        with_decodes: bool,
        copying: &[SeqId],
        time_budget: Option<TimeBudget>,
    ) -> (Vec<(SeqId, usize)>, bool) {
        let prefilling: Vec<SeqId> =
            self.running.iter().copied().filter(|id| !self.seqs[id].is_decoding() && !copying.contains(id)).collect();
        let (long, short): (Vec<SeqId>, Vec<SeqId>) = prefilling.iter().partition(|id| self.seqs[id].long_prefill);
        if !long.is_empty() && !self.long_skipped {
            let (lens, short_finishes) = self.plan_chunks(&short, &long, token_cap, with_decodes, true, time_budget);
            if short_finishes {
                return (lens, true);
            }
        }
        (self.plan_chunks(&short, &long, token_cap, with_decodes, false, time_budget).0, false)
    }

    /// [`Self::plan_prefill_chunks`] for one choice: with `skip_long`, the
    /// long prefills get nothing (but the `min_tokens` floor). Also says
    /// whether a short prefill finishes in the step.
    fn plan_chunks(
        &self,
        short: &[SeqId],
        long: &[SeqId],
        token_cap: usize,
        with_decodes: bool,
        skip_long: bool,
        time_budget: Option<TimeBudget>,
    ) -> (Vec<(SeqId, usize)>, bool) {
        let long_slots = self.config.max_long_partial_prefills.max(1);
        let order: Vec<SeqId> = short.iter().chain(long.iter().take(long_slots)).copied().collect();
        let (mut secs, cost, min_tokens) = match time_budget {
            Some(t) => (if with_decodes { t.mixed_s } else { t.alone_s }, Some(t.cost), t.min_tokens.min(token_cap)),
            None => (f64::INFINITY, None, 0),
        };
        let mut tokens = token_cap;
        // Most tokens of `id`, `done` of them planned already, within
        // `tokens` and `secs`; and what they cost.
        let fit = |id: SeqId, done: usize, tokens: usize, secs: f64| {
            let s = &self.seqs[&id];
            let by_time = cost.map_or(usize::MAX, |c| c.tokens_within(s.num_computed + done, secs));
            (s.remaining() - done).min(tokens).min(by_time)
        };
        let cost_of = |id: SeqId, done: usize, len: usize| cost.map_or(0.0, |c| c.seconds(self.seqs[&id].num_computed + done, len));
        let mut lens: Vec<usize> = vec![0; order.len()];
        // The oldest long prefill's quarter comes off the top.
        if let Some(&first_long) = long.first().filter(|_| !skip_long) {
            let i = short.len();
            lens[i] = fit(first_long, 0, tokens.div_ceil(4), secs / 4.0).max(1).min(self.seqs[&first_long].remaining());
            tokens -= lens[i];
            secs -= cost_of(first_long, 0, lens[i]);
        }
        // Then in order: shorts, the oldest long's top-up, other longs;
        // no top-up in a step where a short prompt finishes: that step
        // yields a first token, so it stays as short as its work.
        let short_finishes = |lens: &[usize]| (0..short.len()).any(|j| lens[j] > 0 && lens[j] == self.seqs[&order[j]].remaining());
        for (i, &id) in order.iter().enumerate() {
            if i >= short.len() && (skip_long || short_finishes(&lens)) {
                break;
            }
            let more = fit(id, lens[i], tokens, secs);
            secs -= cost_of(id, lens[i], more);
            lens[i] += more;
            tokens -= more;
        }
        let finishes = short_finishes(&lens);
        // The floor: at least `min_tokens` in all, in the same order.
        let mut short_of = min_tokens.saturating_sub(lens.iter().sum());
        for (i, &id) in order.iter().enumerate() {
            if short_of == 0 {
                break;
            }
            let more = short_of.min(self.seqs[&id].remaining() - lens[i]).min(tokens);
            lens[i] += more;
            tokens -= more;
            short_of -= more;
        }
        (order.into_iter().zip(lens).filter(|(_, len)| *len > 0).collect(), finishes)
    }
}
