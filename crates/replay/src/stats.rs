//! Percentiles and distribution summaries.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0-100) with linear interpolation between closest
/// ranks (numpy's default); sorts `xs`. `None` when empty.
pub fn percentile(xs: &mut [f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(sorted_percentile(xs, p))
}

fn sorted_percentile(xs: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0).clamp(0.0, 1.0) * (xs.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    xs[lo] + (xs[hi] - xs[lo]) * (rank - lo as f64)
}

/// n, mean, p50, p90, p99 and max of a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub n: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Dist {
    pub fn of(mut xs: Vec<f64>) -> Dist {
        xs.retain(|x| x.is_finite());
        if xs.is_empty() {
            return Dist::default();
        }
        xs.sort_by(f64::total_cmp);
        Dist {
            n: xs.len(),
            mean: Some(xs.iter().sum::<f64>() / xs.len() as f64),
            p50: Some(sorted_percentile(&xs, 50.0)),
            p90: Some(sorted_percentile(&xs, 90.0)),
            p99: Some(sorted_percentile(&xs, 99.0)),
            max: xs.last().copied(),
        }
    }
}

/// Median of the values present.
pub fn median(xs: &[f64]) -> Option<f64> {
    percentile(&mut xs.to_vec(), 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let mut xs = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&mut xs, 50.0), Some(2.5));
        assert!((percentile(&mut xs, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&mut xs, 100.0), Some(4.0));
        assert_eq!(percentile(&mut [], 50.0), None);
    }

    #[test]
    fn dist_ignores_non_finite_values() {
        let d = Dist::of(vec![1.0, f64::NAN, 3.0]);
        assert_eq!((d.n, d.mean, d.max), (2, Some(2.0), Some(3.0)));
        assert_eq!(Dist::of(vec![]).p50, None);
    }
}
