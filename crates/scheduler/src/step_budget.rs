//! The step's budget as one object ([`StepBudget`]): the tokens left under
//! `max_num_batched_tokens` and, when the engine sets one, the seconds of
//! prefill the step may still carry, priced by the measured cost of a
//! chunk, which grows with the context it attends to. Budgets in time
//! rather than tokens let a short prompt (cheap tokens) take a large chunk
//! in the same step where a long prompt deep into its context (dear
//! tokens) takes a small one. Whether a step has a time budget is the
//! engine's decision (`kvc_policy::step_budget`); the planner asks the
//! budget how much of a chunk fits and spends it.

/// Seconds a prefill chunk takes: per token, `a + b * context`, the
/// context being the tokens before the chunk's middle; plus, per chunk,
/// `c * start` (reading the context it attends to, whatever its length).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChunkCost {
    pub a: f64,
    pub b: f64,
    pub c: f64,
}

impl ChunkCost {
    pub fn seconds(&self, start: usize, len: usize) -> f64 {
        if len == 0 {
            return 0.0;
        }
        self.c * start as f64 + len as f64 * (self.a + self.b * (start as f64 + len as f64 / 2.0))
    }

    /// Most tokens from `start` whose chunk fits in `seconds`.
    pub fn tokens_within(&self, start: usize, seconds: f64) -> usize {
        if seconds <= 0.0 {
            return 0;
        }
        if seconds.is_infinite() {
            return usize::MAX;
        }
        let seconds = seconds - self.c * start as f64;
        if seconds <= 0.0 {
            return 0;
        }
        // (b / 2) n^2 + (a + b s) n - seconds <= 0.
        let lin = self.a + self.b * start as f64;
        let n = if self.b > 0.0 {
            (-lin + (lin * lin + 2.0 * self.b * seconds).sqrt()) / self.b
        } else if lin > 0.0 {
            seconds / lin
        } else {
            return usize::MAX;
        };
        if n.is_finite() {
            n.max(0.0).min(usize::MAX as f64 / 2.0) as usize
        } else {
            usize::MAX
        }
    }
}

/// Seconds of prefill a step may carry beside decodes (`mixed_s`) and
/// alone (`alone_s`), at `cost`; a step keeps at least `min_tokens` prefill
/// tokens whatever the time says, so prefill never stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeBudget {
    pub alone_s: f64,
    pub mixed_s: f64,
    pub cost: ChunkCost,
    pub min_tokens: usize,
}

/// One step's budget: the tokens left of `max_num_batched_tokens` and,
/// with a [`TimeBudget`], the seconds of prefill left (its `alone_s` until
/// the step carries a decode, then its `mixed_s`), priced by its
/// [`ChunkCost`]. The engine builds it once per step; the planner spends a
/// copy: the decodes first (a token each; their time is the budget's fixed
/// part), then the prefill chunks, each asking what of it fits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepBudget {
    tokens: usize,
    time: Option<TimeLeft>,
}

/// The seconds of prefill left, and the budget they came from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TimeLeft {
    secs: f64,
    budget: TimeBudget,
}

impl StepBudget {
    /// `max_tokens` tokens and, with `time`, its seconds.
    pub fn new(max_tokens: usize, time: Option<TimeBudget>) -> Self {
        Self { tokens: max_tokens, time: time.map(|budget| TimeLeft { secs: budget.alone_s, budget }) }
    }

    /// Tokens left under the token cap.
    pub fn tokens_left(&self) -> usize {
        self.tokens
    }

    /// The time budget it was built with (None: the token cap only).
    pub fn time_budget(&self) -> Option<TimeBudget> {
        self.time.map(|t| t.budget)
    }

    /// The same tokens, without the time budget.
    pub fn without_time(self) -> Self {
        Self { time: None, ..self }
    }

    /// The step's `n` decodes, before any prefill is spent: a token each,
    /// and prefill beside any of them gets the time budget's `mixed_s`.
    pub fn spend_decodes(&mut self, n: usize) {
        debug_assert!(n <= self.tokens, "{n} decodes over the {} tokens left", self.tokens);
        self.tokens = self.tokens.saturating_sub(n);
        if let Some(t) = self.time.as_mut().filter(|_| n > 0) {
            t.secs = t.budget.mixed_s;
        }
    }

    /// Prefill tokens a step keeps whatever the time says: the time
    /// budget's `min_tokens` within the tokens left (0 without one).
    pub fn floor(&self) -> usize {
        self.time.map_or(0, |t| t.budget.min_tokens.min(self.tokens))
    }

    /// A quarter of what is left: of its tokens (rounded up) and of its
    /// seconds.
    pub fn quarter(&self) -> Self {
        Self { tokens: self.tokens.div_ceil(4), time: self.time.map(|t| TimeLeft { secs: t.secs / 4.0, ..t }) }
    }

    /// Most of `want` tokens of a chunk whose context starts at `start`
    /// that fit in the tokens and the seconds left.
    pub fn fit(&self, start: usize, want: usize) -> usize {
        let by_time = self.time.map_or(usize::MAX, |t| t.budget.cost.tokens_within(start, t.secs));
        want.min(self.tokens).min(by_time)
    }

    /// The oldest long prefill's share (the planner's progress bound): what
    /// of `want` tokens from `start` fits in a [`Self::quarter`], and at
    /// least one token, unless it wants none or no token is left.
    pub fn share(&self, start: usize, want: usize) -> usize {
        self.quarter().fit(start, want).max(1).min(want).min(self.tokens)
    }

    /// Spends a chunk of `len` tokens from `start`: its tokens and, with a
    /// time budget, what it costs.
    pub fn spend(&mut self, start: usize, len: usize) {
        debug_assert!(len <= self.tokens, "a chunk of {len} over the {} tokens left", self.tokens);
        self.tokens = self.tokens.saturating_sub(len);
        if let Some(t) = self.time.as_mut() {
            t.secs -= t.budget.cost.seconds(start, len);
        }
    }

    /// Spends up to `want` tokens whatever the time says (the floor's);
    /// returns how many.
    pub fn spend_tokens(&mut self, want: usize) -> usize {
        let n = want.min(self.tokens);
        self.tokens -= n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_within_inverts_seconds() {
        for cost in [ChunkCost { a: 3e-5, b: 1e-9, c: 0.0 }, ChunkCost { a: 1e-4, b: 0.0, c: 0.0 }, ChunkCost { a: 3e-5, b: 1e-9, c: 4e-8 }]
        {
            for start in [0, 1_000, 50_000] {
                for secs in [0.01, 0.1, 1.0] {
                    let n = cost.tokens_within(start, secs);
                    if n == 0 {
                        assert!(cost.seconds(start, 1) > secs);
                        continue;
                    }
                    assert!(cost.seconds(start, n) <= secs + 1e-12, "{cost:?} {start} {secs} -> {n}");
                    assert!(cost.seconds(start, n + 1) > secs, "{cost:?} {start} {secs} -> {n} is not the most");
                }
            }
        }
        // Deeper context, fewer tokens in the same time.
        let c = ChunkCost { a: 3e-5, b: 1e-9, c: 0.0 };
        assert!(c.tokens_within(60_000, 0.1) < c.tokens_within(0, 0.1));
        assert_eq!(c.tokens_within(0, 0.0), 0);
    }

    /// 1 us per token and 1 ns per token of context; 2 ms alone, 0.5 ms
    /// beside decodes; a floor of 16 tokens.
    fn time() -> TimeBudget {
        TimeBudget { alone_s: 2e-3, mixed_s: 5e-4, cost: ChunkCost { a: 1e-6, b: 1e-9, c: 0.0 }, min_tokens: 16 }
    }

    /// Whether `n` tokens from `start` are the most that fit in `secs`,
    /// judged by the cost's own formula.
    fn most_within(cost: ChunkCost, start: usize, n: usize, secs: f64) -> bool {
        cost.seconds(start, n) <= secs + 1e-12 && cost.seconds(start, n + 1) > secs
    }

    #[test]
    fn the_token_cap_alone_bounds_chunks_by_their_tokens() {
        let mut b = StepBudget::new(100, None);
        assert_eq!((b.time_budget(), b.floor()), (None, 0));
        b.spend_decodes(4);
        assert_eq!(b.tokens_left(), 96);
        // Context costs nothing without a time budget.
        assert_eq!((b.fit(0, 1_000), b.fit(1_000_000, 1_000), b.fit(0, 30)), (96, 96, 30));
        assert_eq!(b.quarter().tokens_left(), 24);
        assert_eq!(b.share(1_000_000, 1_000), 24);
        b.spend(0, 90);
        assert_eq!((b.tokens_left(), b.fit(90, 1_000)), (6, 6));
        assert_eq!(b.quarter().tokens_left(), 2, "a quarter rounds up");
        assert_eq!(b.spend_tokens(10), 6);
        assert_eq!((b.tokens_left(), b.fit(0, 1)), (0, 0));
    }

    #[test]
    fn a_binding_time_budget_sizes_chunks_by_their_context_and_is_spent() {
        let t = time();
        let mut b = StepBudget::new(1_000_000, Some(t));
        assert_eq!(b.time_budget(), Some(t));
        let first = b.fit(0, usize::MAX);
        assert!(first < 1_000_000 && most_within(t.cost, 0, first, t.alone_s), "{first}");
        assert!(b.fit(50_000, usize::MAX) < first, "deeper context, fewer tokens");
        // What is left after a chunk is the rest of the same seconds.
        b.spend(0, first / 2);
        let second = b.fit(first / 2, usize::MAX);
        let spent = t.cost.seconds(0, first / 2);
        assert!(most_within(t.cost, first / 2, second, t.alone_s - spent), "{second}");
        // A quarter: of the seconds too.
        let q = StepBudget::new(1_000_000, Some(t)).quarter().fit(0, usize::MAX);
        assert!(most_within(t.cost, 0, q, t.alone_s / 4.0), "{q}");
        // Beside decodes, the mixed seconds.
        let mut mixed = StepBudget::new(1_000_000, Some(t));
        mixed.spend_decodes(3);
        let n = mixed.fit(0, usize::MAX);
        assert!(most_within(t.cost, 0, n, t.mixed_s) && n < first, "{n}");
        // No decode: still the seconds alone.
        let mut none = StepBudget::new(1_000_000, Some(t));
        none.spend_decodes(0);
        assert_eq!(none.fit(0, usize::MAX), first);
        // Dropping the time leaves the tokens.
        assert_eq!(mixed.without_time().fit(0, usize::MAX), 1_000_000 - 3);
    }

    #[test]
    fn tokens_and_time_each_bind_where_they_are_the_smaller() {
        let t = time();
        let by_time = StepBudget::new(1_000_000, Some(t)).fit(0, usize::MAX);
        // A cap under what the time allows binds; one over it does not.
        assert_eq!(StepBudget::new(by_time / 2, Some(t)).fit(0, usize::MAX), by_time / 2);
        assert_eq!(StepBudget::new(by_time * 2, Some(t)).fit(0, usize::MAX), by_time);
        // The floor is the time budget's, within the tokens left, and is
        // spent in tokens whatever the time says.
        let mut spent = StepBudget::new(1_000, Some(TimeBudget { alone_s: 0.0, mixed_s: 0.0, ..t }));
        assert_eq!((spent.fit(0, 100), spent.floor()), (0, 16));
        assert_eq!(spent.spend_tokens(16), 16);
        assert_eq!(spent.tokens_left(), 984);
        assert_eq!(StepBudget::new(10, Some(t)).floor(), 10);
        // The share is at least a token when one is left, even with no time.
        assert_eq!(spent.share(50_000, 20_000), 1);
        assert_eq!(spent.share(50_000, 0), 0, "a chunk that wants none gets none");
    }

    #[test]
    fn a_step_whose_decodes_take_the_token_cap_leaves_a_long_prefill_nothing() {
        for time in [None, Some(time())] {
            let mut b = StepBudget::new(2, time);
            b.spend_decodes(2);
            assert_eq!(b.tokens_left(), 0);
            // The long prefill's share is not the "at least one" token: none is left.
            assert_eq!(b.share(0, 20_000), 0);
            assert_eq!((b.fit(0, 20_000), b.floor(), b.spend_tokens(16)), (0, 0, 0));
            b.spend(0, 0);
            assert_eq!(b.tokens_left(), 0);
        }
    }
}
