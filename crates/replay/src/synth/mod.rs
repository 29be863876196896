//! Synthesized prompts ([`tokens`], [`prompt`]) and synthetic workloads
//! ([`agentic`], [`microbench`]), made from a seed ([`rng`]).

pub mod agentic;
pub mod microbench;
pub mod prompt;
pub mod rng;
pub mod tokens;

use crate::stats::percentile;
use crate::trace::session::SessionRow;

/// The shape of a session workload, in the seed's terms, for checking a
/// generator and for printing what `kvc-replay synth` made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShapeStats {
    pub sessions: usize,
    pub requests: usize,
    pub min_turns: usize,
    pub max_turns: usize,
    /// Largest prompt of each session: median and max over sessions.
    pub peak_input_p50: f64,
    pub peak_input_max: f64,
    /// New tokens per request that even a perfect session cache must
    /// compute (appends; after a compaction, all past the kept prefix).
    pub new_tokens_p50: f64,
    pub new_tokens_p90: f64,
    /// Think time between turns.
    pub gap_p50_s: f64,
    pub gap_p90_s: f64,
}

impl ShapeStats {
    pub fn of(rows: &[SessionRow]) -> ShapeStats {
        let mut by_session: std::collections::BTreeMap<&str, Vec<&SessionRow>> = Default::default();
        for r in rows {
            by_session.entry(&r.session_id).or_default().push(r);
        }
        let (mut peaks, mut new, mut gaps, mut turns) = (vec![], vec![], vec![], vec![]);
        for rs in by_session.values_mut() {
            rs.sort_by_key(|r| r.turn);
            turns.push(rs.len());
            let (mut ctx, mut prev_out, mut peak) = (0usize, 0usize, 0usize);
            for (i, r) in rs.iter().enumerate() {
                let fresh = match (r.append_length, r.input_length) {
                    (Some(a), _) if i > 0 => {
                        ctx += prev_out + a;
                        a
                    }
                    (_, Some(n)) => {
                        let keep = if i == 0 { 0 } else { r.keep_prefix.unwrap_or(ctx).min(n) };
                        ctx = n;
                        n - keep
                    }
                    (Some(a), None) => {
                        ctx = a;
                        a
                    }
                    (None, None) => 0,
                };
                new.push(fresh as f64);
                if i > 0 {
                    gaps.push(r.think_time_s);
                }
                peak = peak.max(ctx);
                prev_out = r.output_length;
            }
            peaks.push(peak as f64);
        }
        ShapeStats {
            sessions: by_session.len(),
            requests: rows.len(),
            min_turns: turns.iter().copied().min().unwrap_or(0),
            max_turns: turns.iter().copied().max().unwrap_or(0),
            peak_input_p50: percentile(&mut peaks.clone(), 50.0).unwrap_or(0.0),
            peak_input_max: peaks.iter().copied().fold(0.0, f64::max),
            new_tokens_p50: percentile(&mut new.clone(), 50.0).unwrap_or(0.0),
            new_tokens_p90: percentile(&mut new, 90.0).unwrap_or(0.0),
            gap_p50_s: percentile(&mut gaps.clone(), 50.0).unwrap_or(0.0),
            gap_p90_s: percentile(&mut gaps, 90.0).unwrap_or(0.0),
        }
    }
}
