//! Turning one row of logits into one token: biases and penalties, the
//! grammar's mask, the stop tokens masked before `min_tokens`, then
//! greedy or temperature / top-k / top-p / min-p sampling with the
//! request's own random stream (so a seed reproduces, whatever else is
//! batched). The noise of the i-th generated token is keyed by (seed, i),
//! so a token sampled on another worker (a remote prefill's first token)
//! leaves the rest of the stream unchanged; how it draws is in
//! [`Sampler::draw`].

use std::collections::HashMap;

use llguidance::toktrie::SimpleVob;

use crate::{Logprobs, SamplingParams, TokenLogprob};
use kvc_text_front::constrained::apply_mask;

/// Per-request sampling state.
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    /// Tokens generated so far (the position of the next draw).
    step: u64,
    /// Generated-token counts, for frequency / presence penalties.
    counts: HashMap<u32, u32>,
    /// Tokens not drawn before `min_tokens` (the request's stop tokens).
    stop_tokens: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams, default_seed: u64) -> Self {
        let seed = params.seed.unwrap_or(default_seed);
        Self { params, seed, step: 0, counts: HashMap::new(), stop_tokens: Vec::new() }
    }

    /// Masks `stop_tokens` (the request's, EOS among them) until
    /// `min_tokens` tokens have been generated.
    pub fn with_stop_tokens(mut self, stop_tokens: Vec<u32>) -> Self {
        self.stop_tokens = stop_tokens;
        self
    }

    /// Records a token chosen elsewhere (by a prefill worker with the same
    /// parameters and seed) as if it had been sampled here.
    pub fn observe(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
        self.step += 1;
    }

    /// The key of the current position's noise: (seed, step), mixed.
    fn key(&self) -> u64 {
        mix64(self.seed ^ self.step.wrapping_mul(GOLDEN))
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token. `context` is prompt + generated tokens (for
    /// the repetition penalty). Logprobs, when asked for, are those of the
    /// model's raw distribution (as vLLM reports by default).
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> (u32, Option<Logprobs>) {
        self.sample_masked(logits, context, None)
    }

    /// [`Self::sample`] among the tokens `allowed` (a structured-output
    /// grammar's mask), applied after biases and penalties. Logprobs stay
    /// those of the raw distribution.
    pub fn sample_masked(&mut self, logits: &[f32], context: &[u32], allowed: Option<&SimpleVob>) -> (u32, Option<Logprobs>) {
        let mut l = logits.to_vec();
        let p = &self.params;
        for &(tok, bias) in &p.logit_bias {
            if let Some(x) = l.get_mut(tok as usize) {
                *x += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            let mut seen = std::collections::HashSet::new();
            for &t in context {
                if seen.insert(t) {
                    if let Some(x) = l.get_mut(t as usize) {
                        *x = if *x > 0.0 { *x / p.repetition_penalty } else { *x * p.repetition_penalty };
                    }
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(x) = l.get_mut(t as usize) {
                    *x -= p.frequency_penalty * c as f32 + p.presence_penalty;
                }
            }
        }
        if let Some(allowed) = allowed {
            apply_mask(&mut l, allowed);
        }
        if self.step < p.min_tokens as u64 {
            mask_stop_tokens(&mut l, &self.stop_tokens);
        }
        let greedy = p.temperature == 0.0;
        let token = if greedy { argmax(&l) } else { self.draw(&l) };
        self.observe(token);
        let logprobs = self.params.logprobs.map(|top| logprobs_of(logits, token, top));
        (token, logprobs)
    }

    /// Draws from softmax(l / T) restricted by top_k, min_p and top_p (the
    /// nucleus is taken over what top_k and min_p kept, renormalised, as
    /// vLLM does). Nothing sorts the whole vocabulary (152K entries for
    /// Qwen3, some milliseconds a token: at 40 decodes a step it was most
    /// of a GPU step): top_k selects, min_p filters, and top_p sorts only
    /// as many of the best candidates as its nucleus needs. Ranks break
    /// ties by the lower token id, so what is kept is a function of the
    /// logits alone.
    ///
    /// The draw is an exponential race (vLLM's sampler draws the same
    /// way): kept token `t` of weight `w` gets the noise `E = -ln(u)`,
    /// `u` uniform from (seed, step, t) alone, and the largest `w / E`
    /// wins (ties: the lower id), which picks `t` with probability
    /// `w / sum(w)`. The winner does not depend on the order the
    /// candidates are visited in, and a tiny change in the logits (from
    /// another batch shape on a GPU) changes it only if it swaps the two
    /// best scores; a draw by cumulative sum over a flat 152K distribution
    /// moved with almost any change (issue 33).
    fn draw(&self, l: &[f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut cand: Vec<(u32, f32)> =
            l.iter().enumerate().filter(|(_, &x)| x.is_finite()).map(|(i, &x)| (i as u32, ((x - max) * inv_t).exp())).collect();
        if cand.is_empty() {
            return argmax(l);
        }
        // Best first: higher weight, then lower token id.
        let better = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, better);
            cand.truncate(p.top_k);
        }
        if p.min_p > 0.0 {
            let best = cand.iter().map(|c| c.1).fold(0.0f32, f32::max);
            let threshold = p.min_p * best;
            cand.retain(|c| c.1 >= threshold);
        }
        if p.top_p < 1.0 {
            // Summed in the order top_k's selection left (deterministic).
            let total: f32 = cand.iter().map(|c| c.1).sum();
            // Sort the best m, growing m until their mass reaches top_p.
            let mut m = 256.min(cand.len());
            loop {
                if m < cand.len() {
                    cand.select_nth_unstable_by(m - 1, better);
                }
                cand[..m].sort_unstable_by(better);
                let mut acc = 0.0;
                let keep = cand[..m].iter().position(|c| {
                    acc += c.1 / total;
                    acc >= p.top_p
                });
                match keep {
                    Some(i) => {
                        cand.truncate(i + 1);
                        break;
                    }
                    None if m == cand.len() => break,
                    None => m = (m * 4).min(cand.len()),
                }
            }
        }
        race(&cand, self.key())
    }
}

/// The exponential race of [`Sampler::draw`] over `cand` (token, weight),
/// with the noise of `key`. `-ln(u) >= 1 - u`, so `w / (1 - u)` bounds a
/// score from above: a token whose bound is below the best score so far
/// is passed without its logarithm (all but a few dozen of 152K).
fn race(cand: &[(u32, f32)], key: u64) -> u32 {
    let mut best: Option<(f64, u32)> = None;
    for &(t, w) in cand {
        let u = uniform(key, t);
        let w = w as f64;
        if let Some((b, _)) = best {
            // The margin covers the rounding of ln against the bound.
            if w / (1.0 - u) * (1.0 + 1e-9) < b {
                continue;
            }
        }
        let score = w / -u.ln();
        if best.is_none_or(|(b, bt)| score > b || (score == b && t < bt)) {
            best = Some((score, t));
        }
    }
    best.map_or(0, |b| b.1)
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser: a well-mixed 64-bit value of `z`.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Token `t`'s uniform in (0, 1) under `key`: the (t + 1)-th output of
/// SplitMix64 started at `key`, its top 52 bits centred in their interval
/// (exact in an f64, never 0 or 1).
fn uniform(key: u64, t: u32) -> f64 {
    let h = mix64(key.wrapping_add((t as u64 + 1).wrapping_mul(GOLDEN)));
    ((h >> 12) as f64 + 0.5) / (1u64 << 52) as f64
}

/// Sets the stop tokens' logits to -inf (vLLM's `min_tokens`), unless
/// nothing else is left: a grammar that allows only the end wins over
/// `min_tokens` (else nothing could be drawn).
fn mask_stop_tokens(l: &mut [f32], stop_tokens: &[u32]) {
    let saved: Vec<(usize, f32)> = stop_tokens.iter().filter_map(|&t| Some((t as usize, *l.get(t as usize)?))).collect();
    for &(t, _) in &saved {
        l[t] = f32::NEG_INFINITY;
    }
    if !l.iter().any(|x| x.is_finite()) {
        for (t, x) in saved {
            l[t] = x;
        }
    }
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-softmax of `logits` at `token` and the `top` best alternatives.
pub fn logprobs_of(logits: &[f32], token: u32, top: usize) -> Logprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    let lp = |t: u32| TokenLogprob { token_id: t, logprob: logits[t as usize] - lse };
    let top = top.min(logits.len());
    let mut idx: Vec<u32> = Vec::new();
    if top > 0 {
        idx = (0..logits.len() as u32).collect();
        idx.select_nth_unstable_by(top - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        idx.truncate(top);
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    }
    Logprobs { chosen: lp(token), top: idx.into_iter().map(lp).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams { max_tokens: 1, ..Default::default() };
        f(&mut p);
        p
    }

    /// A greedy sampler (temperature 0) with `f`'s other settings.
    fn greedy(f: impl FnOnce(&mut SamplingParams)) -> Sampler {
        Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                f(p);
            }),
            0,
        )
    }

    #[test]
    fn greedy_picks_the_largest_logit() {
        let mut s = greedy(|_| {});
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]).0, 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(|p| p.seed = Some(seed)), 0);
            (0..32).map(|_| s.sample(&logits, &[]).0).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn a_token_observed_from_elsewhere_leaves_the_rest_of_the_stream_unchanged() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = params(|p| p.seed = Some(7));
        let mut here = Sampler::new(p.clone(), 0);
        let all: Vec<u32> = (0..16).map(|_| here.sample(&logits, &[]).0).collect();
        // Another worker samples the first token; this one continues.
        let mut there = Sampler::new(p.clone(), 99);
        let first = Sampler::new(p, 5).sample(&logits, &[]).0;
        there.observe(first);
        let rest: Vec<u32> = (1..16).map(|_| there.sample(&logits, &[]).0).collect();
        assert_eq!(first, all[0]);
        assert_eq!(rest, all[1..]);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(params(|p| p.top_k = 1), 3);
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.9], &[]).0, 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // p = [0.9, 0.05, 0.05]: top_p 0.5 leaves only token 0.
        let l = [0.9f32.ln(), 0.05f32.ln(), 0.05f32.ln()];
        let mut s = Sampler::new(params(|p| p.top_p = 0.5), 5);
        for _ in 0..50 {
            assert_eq!(s.sample(&l, &[]).0, 0);
        }
    }

    #[test]
    fn min_p_removes_unlikely_tokens() {
        let l = [0.0f32, -10.0, -10.0];
        let mut s = Sampler::new(params(|p| p.min_p = 0.1), 5);
        for _ in 0..50 {
            assert_eq!(s.sample(&l, &[]).0, 0);
        }
    }

    #[test]
    fn logit_bias_can_force_a_token() {
        let mut s = greedy(|p| p.logit_bias = vec![(2, 100.0)]);
        assert_eq!(s.sample(&[5.0, 1.0, 0.0], &[]).0, 2);
    }

    #[test]
    fn stop_tokens_are_masked_until_min_tokens_even_against_a_bias() {
        let mut s = greedy(|p| {
            p.min_tokens = 2;
            p.logit_bias = vec![(0, 100.0)];
        })
        .with_stop_tokens(vec![0, 2]);
        let l = [5.0f32, 1.0, 3.0];
        assert_eq!((0..3).map(|_| s.sample(&l, &[]).0).collect::<Vec<_>>(), vec![1, 1, 0]);
        // Sampled too: never a stop token before the minimum.
        let mut s = Sampler::new(params(|p| p.min_tokens = 50), 9).with_stop_tokens(vec![0, 2]);
        assert!((0..50).all(|_| s.sample(&l, &[]).0 == 1));
    }

    #[test]
    fn a_grammar_that_allows_only_a_stop_token_wins_over_min_tokens() {
        let mut s = Sampler::new(params(|p| p.min_tokens = 5), 0).with_stop_tokens(vec![2]);
        let mut only_stop = SimpleVob::alloc(3);
        only_stop.allow_token(2);
        assert_eq!(s.sample_masked(&[5.0, 1.0, 0.0], &[], Some(&only_stop)).0, 2);
    }

    #[test]
    fn penalties_discourage_repeats() {
        let mut s = greedy(|p| p.presence_penalty = 2.0);
        let l = [1.0f32, 0.5];
        assert_eq!(s.sample(&l, &[]).0, 0);
        assert_eq!(s.sample(&l, &[0]).0, 1);
        let mut r = greedy(|p| p.repetition_penalty = 4.0);
        assert_eq!(r.sample(&l, &[0]).0, 1);
    }

    #[test]
    fn logprobs_are_normalised_and_sorted() {
        let l = [1.0f32, 3.0, 2.0];
        let lp = logprobs_of(&l, 0, 2);
        let total: f32 = l.iter().map(|&x| (x - 1.0 + lp.chosen.logprob).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.token_id).collect::<Vec<_>>(), vec![1, 2]);
    }

    /// Draw frequencies follow the filtered distribution: top_p 0.75 over
    /// p = [0.5, 0.3, 0.1, 0.1] keeps tokens 0 and 1 (renormalised to
    /// 0.625 / 0.375); top_k 3 keeps 0, 1 and one of the 0.1s.
    #[test]
    fn draws_follow_the_filtered_distribution() {
        let l: Vec<f32> = [0.5f32, 0.3, 0.1, 0.1].iter().map(|p| p.ln()).collect();
        let freq = |f: fn(&mut SamplingParams)| {
            let mut s = Sampler::new(params(f), 11);
            let mut n = [0usize; 4];
            for _ in 0..20_000 {
                n[s.sample(&l, &[]).0 as usize] += 1;
            }
            n.map(|c| c as f64 / 20_000.0)
        };
        let f = freq(|p| p.top_p = 0.75);
        assert!((f[0] - 0.625).abs() < 0.02 && (f[1] - 0.375).abs() < 0.02 && f[2] + f[3] == 0.0, "{f:?}");
        let f = freq(|p| p.top_k = 3);
        assert!((f[0] - 0.5 / 0.9).abs() < 0.02 && (f[2] + f[3] - 0.1 / 0.9).abs() < 0.02 && f[2] * f[3] == 0.0, "{f:?}");
        let f = freq(|_| {});
        assert!(f.iter().zip([0.5, 0.3, 0.1, 0.1]).all(|(a, b)| (a - b).abs() < 0.02), "{f:?}");
    }

    /// The race's winner is the largest `w / -ln(u)` (ties: the lower id)
    /// computed for every candidate, in whatever order the candidates
    /// come: the bound that skips most logarithms never skips the winner.
    #[test]
    fn the_race_picks_the_best_score_in_any_order() {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for key in 0..300u64 {
            let mut cand: Vec<(u32, f32)> = (0..400).map(|t| (t, rng.random::<f32>().powi(6))).collect();
            let score = |&(t, w): &(u32, f32)| (w as f64 / -uniform(key, t).ln(), t);
            let expect = cand.iter().map(score).max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1))).unwrap().1;
            assert_eq!(race(&cand, key), expect);
            cand.shuffle(&mut rng);
            assert_eq!(race(&cand, key), expect);
            cand.sort_by(|a, b| a.1.total_cmp(&b.1));
            assert_eq!(race(&cand, key), expect);
        }
    }

    /// Logits that differ by ~1e-6 (what another batch shape can do to a
    /// GPU's sums) leave a seeded stream's tokens unchanged over a flat
    /// 152K vocabulary, the case where a draw by cumulative sum moved with
    /// almost any change (issue 33): with top_p, top_k or neither.
    #[test]
    fn logits_that_differ_in_the_sixth_decimal_draw_the_same_tokens() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let a: Vec<f32> = (0..151_936).map(|_| rng.random::<f32>()).collect();
        let b: Vec<f32> = a.iter().map(|x| x + (rng.random::<f32>() - 0.5) * 2e-6).collect();
        assert!(a.iter().zip(&b).filter(|(x, y)| x != y).count() > 100_000);
        let filters: [fn(&mut SamplingParams); 3] = [|_| {}, |p| p.top_p = 0.9, |p| p.top_k = 50];
        for f in filters {
            let run = |l: &[f32]| {
                let mut s = Sampler::new(params(f), 7);
                (0..40).map(|_| s.sample(l, &[]).0).collect::<Vec<_>>()
            };
            assert_eq!(run(&a), run(&b));
        }
    }

    /// A Qwen3-sized vocabulary with top_p: the nucleus of a peaked
    /// distribution is found without sorting everything, and a flat one
    /// still gets the whole sort.
    #[test]
    fn top_p_on_a_large_vocabulary_matches_the_full_sort() {
        let peaked: Vec<f32> = (0..151_936).map(|i| if i % 9_973 == 0 { 8.0 } else { -((i % 97) as f32) / 10.0 }).collect();
        let flat: Vec<f32> = (0..151_936).map(|i| ((i * 7919) % 1000) as f32 / 1e4).collect();
        for l in [peaked, flat] {
            let mut s = Sampler::new(params(|p| p.top_p = 0.9), 3);
            for _ in 0..5 {
                let t = s.sample(&l, &[]).0 as usize;
                // The drawn token is in the nucleus of the full sort.
                let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut w: Vec<(usize, f32)> = l.iter().enumerate().map(|(i, &x)| (i, (x - max).exp())).collect();
                w.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let total: f32 = w.iter().map(|c| c.1).sum();
                let mut acc = 0.0;
                let n = w
                    .iter()
                    .position(|c| {
                        acc += c.1 / total;
                        acc >= 0.9
                    })
                    .unwrap()
                    + 1;
                assert!(w[..n].iter().any(|c| c.0 == t), "token {t} outside the nucleus of {n}");
            }
        }
    }
}
