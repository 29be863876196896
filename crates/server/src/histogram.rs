//! A lock-free Prometheus histogram (cumulative buckets, `_sum`, `_count`)
//! small enough not to need a metrics crate.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Time to first token, in seconds (vLLM's buckets).
pub const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
/// Time between two tokens of one sequence, in seconds (vLLM's buckets
/// plus 0.04, the decode-latency target issue 17 checks).
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Whole-request and queue times, in seconds (vLLM's buckets).
pub const REQUEST_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];

#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds, ascending; `+Inf` is implicit.
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts; the last one is `+Inf`.
    counts: Vec<AtomicU64>,
    /// f64 bits of the sum of observations.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds must ascend");
        Self { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: AtomicU64::new(0f64.to_bits()) }
    }

    pub fn observe(&self, value: f64) {
        if !value.is_finite() {
            return;
        }
        let bucket = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self.sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| Some((f64::from_bits(bits) + value).to_bits()));
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }

    /// Appends the exposition of this histogram under `name`.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum());
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_cumulative_buckets_with_sum_and_count() {
        let h = Histogram::new(&[0.125, 1.0]);
        for v in [0.0625, 0.125, 0.5, 3.0, f64::NAN] {
            h.observe(v);
        }
        let mut text = String::new();
        h.render(&mut text, "x_seconds", "help");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            vec![
                "# HELP x_seconds help",
                "# TYPE x_seconds histogram",
                "x_seconds_bucket{le=\"0.125\"} 2",
                "x_seconds_bucket{le=\"1\"} 3",
                "x_seconds_bucket{le=\"+Inf\"} 4",
                "x_seconds_sum 3.6875",
                "x_seconds_count 4",
            ]
        );
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let h = std::sync::Arc::new(Histogram::new(TTFT_BUCKETS));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| h.observe(0.5)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(h.count(), 4000);
        assert!((h.sum() - 2000.0).abs() < 1e-6);
    }
}
