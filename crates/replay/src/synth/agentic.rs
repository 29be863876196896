//! A synthetic agentic workload with the shape of the predecessor's
//! SWE-bench trace (shared/seeds/003): about 50 sessions of 8-150 turns,
//! peak input per session median ~49K tokens (max ~104K), per-turn new
//! tokens p50 ~610 with a tail to ~36K at p90, think gaps p50 2.5 s and
//! p90 7.8 s.
//!
//! How a session is made: a first prompt (system prompt + task), then each
//! turn appends the previous answer and new input, mostly small (tool
//! results), sometimes large (a file or a test log). When the context
//! would pass the session's peak, the agent compacts: the new prompt keeps
//! the first prompt and replaces the rest, so the server must recompute
//! everything after it. Those compactions and the large appends are the
//! tail of "new tokens per turn".
//!
//! Caveat: the seed measured that tail as tokens its cache *missed*, under
//! a system that missed often, so the real workload's tail may be lighter;
//! `AgenticShape::large_append_prob` sets it. Output lengths are not in the
//! seed; the default (median 180) is an assumption.

use super::rng::{sigma_from_p50_p90, Rng};
use crate::trace::session::SessionRow;
use crate::trace::Scale;

#[derive(Debug, Clone)]
pub struct AgenticShape {
    pub sessions: usize,
    pub min_turns: usize,
    pub max_turns: usize,
    pub peak_input_median: f64,
    pub peak_input_sigma: f64,
    pub peak_input_max: f64,
    pub peak_input_min: f64,
    pub first_prompt_median: f64,
    pub first_prompt_sigma: f64,
    pub small_append_median: f64,
    pub small_append_sigma: f64,
    pub large_append_prob: f64,
    pub large_append_median: f64,
    pub large_append_sigma: f64,
    pub output_median: f64,
    pub output_sigma: f64,
    pub output_max: f64,
    pub gap_p50_s: f64,
    pub gap_p90_s: f64,
    pub gap_max_s: f64,
    /// Sessions start at uniform times in [0, this).
    pub arrival_window_s: f64,
}

impl Default for AgenticShape {
    fn default() -> Self {
        AgenticShape {
            sessions: 50,
            min_turns: 8,
            max_turns: 150,
            peak_input_median: 49_000.0,
            // The largest of 50 draws lands near 104K.
            peak_input_sigma: 0.38,
            peak_input_max: 104_000.0,
            peak_input_min: 12_000.0,
            first_prompt_median: 6_000.0,
            first_prompt_sigma: 0.4,
            small_append_median: 330.0,
            small_append_sigma: 1.1,
            large_append_prob: 0.17,
            large_append_median: 60_000.0,
            large_append_sigma: 0.4,
            output_median: 180.0,
            output_sigma: 0.7,
            output_max: 2048.0,
            gap_p50_s: 2.5,
            gap_p90_s: 7.8,
            gap_max_s: 261.0,
            arrival_window_s: 60.0,
        }
    }
}

/// Sessions in kvc's session format, lengths multiplied by `scale` and the
/// session count too (at least one); times are not scaled (that is
/// `--time-scale`'s job, and it is printed in every report).
pub fn generate(shape: &AgenticShape, scale: Scale, seed: u64) -> Vec<SessionRow> {
    let mut rng = Rng::new(seed ^ 0xA6E7);
    let gap_sigma = sigma_from_p50_p90(shape.gap_p50_s, shape.gap_p90_s);
    let mut rows = Vec::new();
    for s in 0..scale.count(shape.sessions) {
        let id = format!("agentic-{s:03}");
        let turns = rng.range(shape.min_turns as u64, shape.max_turns as u64) as usize;
        let peak = rng.lognormal(shape.peak_input_median, shape.peak_input_sigma).clamp(shape.peak_input_min, shape.peak_input_max);
        let first = rng.lognormal(shape.first_prompt_median, shape.first_prompt_sigma).clamp(1_000.0, peak / 4.0);
        let start = rng.unit() * shape.arrival_window_s;
        let output = |rng: &mut Rng| rng.lognormal(shape.output_median, shape.output_sigma).clamp(8.0, shape.output_max);
        let mut context = first;
        let mut out = output(&mut rng);
        rows.push(SessionRow {
            session_id: id.clone(),
            turn: 0,
            start_time_s: Some(round3(start)),
            think_time_s: 0.0,
            input_length: Some(scale.len(first as usize)),
            append_length: None,
            keep_prefix: None,
            output_length: scale.len(out as usize),
        });
        for t in 1..turns {
            let append = if rng.unit() < shape.large_append_prob {
                rng.lognormal(shape.large_append_median, shape.large_append_sigma)
            } else {
                rng.lognormal(shape.small_append_median, shape.small_append_sigma)
            }
            .max(1.0);
            let think = rng.lognormal(shape.gap_p50_s, gap_sigma).clamp(0.05, shape.gap_max_s);
            let mut row = SessionRow {
                session_id: id.clone(),
                turn: t,
                start_time_s: None,
                think_time_s: round3(think),
                input_length: None,
                append_length: None,
                keep_prefix: None,
                output_length: 0,
            };
            if context + out + append > peak {
                // Compaction: keep the first prompt, summarize the rest.
                let input = (peak * (0.35 + 0.25 * rng.unit())).max(first + append).min(peak);
                row.input_length = Some(scale.len(input as usize));
                row.keep_prefix = Some(scale.len(first as usize));
                context = input;
            } else {
                row.append_length = Some(scale.len(append as usize));
                context += out + append;
            }
            out = output(&mut rng);
            row.output_length = scale.len(out as usize);
            rows.push(row);
        }
    }
    rows
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::ShapeStats;

    #[test]
    fn default_shape_matches_the_seed_003_swebench_workload() {
        let rows = generate(&AgenticShape::default(), Scale::ONE, 1);
        let s = ShapeStats::of(&rows);
        assert_eq!(s.sessions, 50);
        assert!(s.min_turns >= 8 && s.max_turns <= 150, "{s:?}");
        assert!((40_000.0..58_000.0).contains(&s.peak_input_p50), "{s:?}");
        assert!(s.peak_input_max <= 104_000.0 && s.peak_input_max > 80_000.0, "{s:?}");
        assert!((520.0..720.0).contains(&s.new_tokens_p50), "{s:?}");
        assert!((31_000.0..42_000.0).contains(&s.new_tokens_p90), "{s:?}");
        assert!((2.2..2.8).contains(&s.gap_p50_s), "{s:?}");
        assert!((6.8..8.8).contains(&s.gap_p90_s), "{s:?}");
    }

    #[test]
    fn scale_shrinks_lengths_and_session_count_but_not_time() {
        let full = generate(&AgenticShape::default(), Scale::ONE, 3);
        let small = generate(&AgenticShape::default(), "1/10".parse().unwrap(), 3);
        assert_eq!(ShapeStats::of(&small).sessions, 5);
        let (a, b) = (&full[0], &small[0]);
        assert_eq!(a.start_time_s, b.start_time_s);
        let (fa, fb) = (a.input_length.unwrap() as f64, b.input_length.unwrap() as f64);
        assert!((fa / 10.0 - fb).abs() <= 1.0, "{fa} vs {fb}");
    }

    #[test]
    fn sessions_start_inside_the_arrival_window() {
        let shape = AgenticShape { sessions: 40, arrival_window_s: 4.8, ..AgenticShape::default() };
        let starts: Vec<f64> = generate(&shape, Scale::ONE, 5).iter().filter_map(|r| r.start_time_s).collect();
        assert_eq!(starts.len(), 40);
        assert!(starts.iter().all(|&t| (0.0..4.8).contains(&t)), "{starts:?}");
        // Spread over the window, not bunched at its start.
        assert!(starts.iter().any(|&t| t > 2.4) && starts.iter().any(|&t| t < 2.4), "{starts:?}");
    }
}
