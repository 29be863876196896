//! Percentiles and the printed rows.

use std::time::Duration;

use crate::workload::Workload;

pub const HEADER: &str = "size      pattern     ranges  impl              p50 ms   p90 ms   p99 ms   min ms  GB/s@p50";

/// The `p`-quantile (nearest rank) of `samples`.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn row(w: &Workload, name: &str, ranges: usize, samples: &[Duration]) -> String {
    let p50 = percentile(samples, 0.5);
    format!(
        "{:<9} {:<11} {:>6}  {:<15} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.3}",
        format!("{}MiB", w.bytes >> 20),
        format!("{:?}", w.pattern).to_lowercase(),
        ranges,
        name,
        ms(p50),
        ms(percentile(samples, 0.9)),
        ms(percentile(samples, 0.99)),
        ms(percentile(samples, 0.0)),
        w.bytes as f64 / p50.as_secs_f64() / 1e9,
    )
}

/// kvc's p50 throughput as a share of the baseline's.
pub fn ratio_row(kvc: &[Duration], base: &[Duration]) -> String {
    let ratio = percentile(base, 0.5).as_secs_f64() / percentile(kvc, 0.5).as_secs_f64();
    format!("{:<9} {:<11} {:>6}  kvc / alone throughput at p50: {:.1} %", "", "", "", ratio * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 0.5), Duration::from_millis(5));
        assert_eq!(percentile(&s, 0.9), Duration::from_millis(9));
        assert_eq!(percentile(&s, 0.99), Duration::from_millis(10));
        assert_eq!(percentile(&s, 0.0), Duration::from_millis(1));
    }
}
