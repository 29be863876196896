//! The microbench: a few sessions of a few turns with small appends, the
//! predecessor's `microbench.py` defaults (8 sessions x 3 turns, 10K first
//! prompt, 1K appends, 1K outputs, 1 s gaps, sessions 0.1 s apart). It is
//! the best case for session caching (everything fits, appends are small):
//! a win here says the mechanism works, not that it wins on agentic traces.

use crate::trace::session::SessionRow;
use crate::trace::Scale;

#[derive(Debug, Clone)]
pub struct MicroShape {
    pub sessions: usize,
    pub turns: usize,
    pub first_prompt: usize,
    pub append: usize,
    pub output: usize,
    pub gap_s: f64,
    pub stagger_s: f64,
}

impl Default for MicroShape {
    fn default() -> Self {
        MicroShape { sessions: 8, turns: 3, first_prompt: 10_000, append: 1_000, output: 1_000, gap_s: 1.0, stagger_s: 0.1 }
    }
}

/// Lengths and the session count multiplied by `scale`.
pub fn generate(shape: &MicroShape, scale: Scale) -> Vec<SessionRow> {
    let mut rows = Vec::new();
    for s in 0..scale.count(shape.sessions) {
        for t in 0..shape.turns {
            rows.push(SessionRow {
                session_id: format!("micro-{s:03}"),
                turn: t,
                start_time_s: (t == 0).then_some(s as f64 * shape.stagger_s),
                think_time_s: if t == 0 { 0.0 } else { shape.gap_s },
                input_length: (t == 0).then_some(scale.len(shape.first_prompt)),
                append_length: (t > 0).then_some(scale.len(shape.append)),
                keep_prefix: None,
                output_length: scale.len(shape.output),
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_predecessors_microbench_scaled_by_one_factor() {
        let rows = generate(&MicroShape::default(), "1/4".parse().unwrap());
        assert_eq!(rows.len(), 2 * 3);
        assert_eq!(rows[0].input_length, Some(2500));
        assert_eq!(rows[1].append_length, Some(250));
        assert_eq!(rows[1].think_time_s, 1.0);
        assert_eq!(rows[3].start_time_s, Some(0.1));
    }
}
