//! The moving average of a measured rate or cost.

/// An exponentially weighted moving average: each new sample weighs 0.2,
/// the average so far 0.8; the first sample is taken as is.
///
/// "No sample yet" is a stored 0.0 (as the averages this replaces kept
/// it): a sample of exactly 0.0 leaves the average at 0.0, and the sample
/// after it is again taken as is. [`Ewma::get`] is 0.0 until measured,
/// which the callers read as "unknown".
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ewma {
    value: f64,
}

impl Ewma {
    /// Weight of a new sample.
    pub const ALPHA: f64 = 0.2;

    /// No sample yet (0.0).
    pub const fn new() -> Self {
        Self { value: 0.0 }
    }

    /// Resumes an average kept elsewhere as a bare `f64` (0.0: no sample yet).
    pub const fn from_value(value: f64) -> Self {
        Self { value }
    }

    /// Folds in a sample and returns the new average.
    pub fn update(&mut self, sample: f64) -> f64 {
        // Written as the copies it replaces wrote it (0.8 * x + 0.2 * s),
        // so the results are the same to the bit.
        self.value = if self.value == 0.0 { sample } else { 0.8 * self.value + 0.2 * sample };
        self.value
    }

    /// The average (0.0 until measured).
    pub fn get(&self) -> f64 {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formula of the copies this type replaced.
    fn formula(x: f64, s: f64) -> f64 {
        if x == 0.0 {
            s
        } else {
            0.8 * x + 0.2 * s
        }
    }

    #[test]
    fn the_first_sample_is_taken_as_is() {
        let mut e = Ewma::new();
        assert_eq!(e.get(), 0.0);
        assert_eq!(e.update(1234.5), 1234.5);
        assert_eq!(e.get(), 1234.5);
        assert_eq!(Ewma::default(), Ewma::new());
    }

    #[test]
    fn a_new_sample_weighs_a_fifth() {
        let mut e = Ewma::new();
        e.update(100.0);
        e.update(200.0);
        assert_eq!(e.get(), 0.8 * 100.0 + 0.2 * 200.0);
        assert!((e.get() - 120.0).abs() < 1e-9);
        assert_eq!(Ewma::ALPHA, 0.2);
    }

    #[test]
    fn it_converges_to_a_steady_sample() {
        let mut e = Ewma::new();
        e.update(1.0);
        for _ in 0..200 {
            e.update(50.0);
        }
        assert!((e.get() - 50.0).abs() < 1e-9, "{}", e.get());
        // Monotone approach from below.
        let mut e = Ewma::from_value(10.0);
        let mut last = e.get();
        for _ in 0..20 {
            let v = e.update(20.0);
            assert!(v > last && v <= 20.0);
            last = v;
        }
    }

    #[test]
    fn identical_to_the_formula_bit_for_bit() {
        let samples = [3.7, 0.0, 1e9, 2.5e-3, 0.0, 0.0, 42.0, 1e-300, 7.0, -0.0, 5.5, 123456.789];
        let (mut e, mut x) = (Ewma::new(), 0.0f64);
        for s in samples {
            x = formula(x, s);
            e.update(s);
            assert_eq!(e.get().to_bits(), x.to_bits(), "after sample {s}");
        }
        // Resumed from a bare value, as a caller keeping an f64 does.
        for (x0, s) in [(0.0, 9.0), (3.0, 9.0), (1e-12, 1e12)] {
            let mut e = Ewma::from_value(x0);
            assert_eq!(e.update(s).to_bits(), formula(x0, s).to_bits());
        }
    }

    #[test]
    fn a_stored_zero_means_no_sample_yet() {
        let mut e = Ewma::new();
        e.update(0.0);
        assert_eq!(e.get(), 0.0);
        assert_eq!(e.update(8.0), 8.0, "the sample after a zero is taken as is");
    }
}
