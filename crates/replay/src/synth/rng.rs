//! A small deterministic random source. splitmix64 is used instead of the
//! `rand` crate so that a seed names the same trace and the same prompt
//! tokens forever (rand's `StdRng` may change algorithm between versions).

/// One splitmix64 step: a good 64-bit mix of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Mixes several words into one seed.
pub fn mix_all(words: &[u64]) -> u64 {
    words.iter().fold(0x6A09_E667_F3BC_C909, |acc, &w| mix(acc ^ mix(w)))
}

#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: mix(seed) }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Log-normal with the given median and log-space sigma.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}

/// Sigma of a log-normal whose p50 and p90 are the given values.
pub fn sigma_from_p50_p90(p50: f64, p90: f64) -> f64 {
    (p90 / p50).ln() / 1.281_551_565_5
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_same_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn lognormal_hits_its_median_and_p90() {
        let mut r = Rng::new(1);
        let sigma = sigma_from_p50_p90(2.5, 7.8);
        let mut xs: Vec<f64> = (0..20_000).map(|_| r.lognormal(2.5, sigma)).collect();
        xs.sort_by(f64::total_cmp);
        let (p50, p90) = (xs[10_000], xs[18_000]);
        assert!((p50 - 2.5).abs() < 0.1, "p50 {p50}");
        assert!((p90 - 7.8).abs() < 0.4, "p90 {p90}");
    }
}
