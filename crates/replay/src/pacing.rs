//! When a session's next turn is due: after the previous one's think time
//! (`Pacing::Think`), or at its trace arrival (`Pacing::Arrival`). The
//! [`crate::driver`] sends each turn when [`Pacing::due`] says.

use std::time::{Duration, Instant};

use crate::trace::Turn;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pacing {
    /// Turn N+1 starts think time after turn N ends.
    Think,
    /// Turn N+1 starts at its trace arrival, or when turn N ends if later.
    Arrival,
}

crate::named::from_str_by_serde_name!(Pacing, "pacing", "think, arrival");

impl Pacing {
    /// When `turn` is due in a run started at `t0` that plays the trace
    /// `time_scale` times faster: a session's first turn (`prev_end`
    /// `None`) at its trace arrival; a later one by the pacing, from the
    /// end of the previous turn.
    pub fn due(self, t0: Instant, time_scale: f64, prev_end: Option<Instant>, turn: &Turn) -> Instant {
        let at = |trace_s: f64| t0 + Duration::from_secs_f64((trace_s / time_scale).max(0.0));
        match (prev_end, self) {
            (None, _) => at(turn.arrival_s),
            (Some(end), Pacing::Think) => end + Duration::from_secs_f64((turn.think_s / time_scale).max(0.0)),
            (Some(end), Pacing::Arrival) => end.max(at(turn.arrival_s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Growth, PromptSpec};

    #[test]
    fn a_turn_is_due_at_its_arrival_first_then_by_the_pacing() {
        let turn = Turn { turn: 1, arrival_s: 10.0, think_s: 4.0, prompt: PromptSpec::Grow(Growth::Append(1)), output_tokens: 1 };
        let t0 = Instant::now();
        let s = |d: Instant| d.duration_since(t0).as_secs_f64();
        assert_eq!(s(Pacing::Think.due(t0, 2.0, None, &turn)), 5.0, "trace time over the time scale");
        let end = t0 + Duration::from_secs(1);
        assert_eq!(s(Pacing::Think.due(t0, 2.0, Some(end), &turn)), 3.0, "the end plus the scaled think time");
        assert_eq!(s(Pacing::Arrival.due(t0, 2.0, Some(end), &turn)), 5.0, "the arrival, later than the end");
        let late = t0 + Duration::from_secs(7);
        assert_eq!(s(Pacing::Arrival.due(t0, 2.0, Some(late), &turn)), 7.0, "the end, later than the arrival");
        assert_eq!(("think".parse(), "arrival".parse()), (Ok(Pacing::Think), Ok(Pacing::Arrival)));
        assert_eq!("Think".parse::<Pacing>(), Err("unknown pacing \"Think\" (think, arrival)".to_string()));
    }
}
