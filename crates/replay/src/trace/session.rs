//! kvc's own session format: one JSON object per turn.
//!
//! ```json
//! {"session_id": "s1", "turn": 0, "start_time_s": 0.0, "input_length": 6000, "output_length": 200}
//! {"session_id": "s1", "turn": 1, "think_time_s": 2.5, "append_length": 610, "output_length": 150}
//! {"session_id": "s1", "turn": 2, "think_time_s": 3.1, "input_length": 9000, "keep_prefix": 6000, "output_length": 90}
//! ```
//!
//! - A session's first turn gives `input_length` (new tokens) and
//!   optionally `start_time_s`, when the session starts.
//! - A later turn gives either `append_length` (the previous prompt, the
//!   previous output and this many new tokens), or `input_length` (a prompt
//!   of this length: the previous context, cut to `keep_prefix` tokens when
//!   given, then new tokens: how a context compaction looks).
//! - `think_time_s`: pause between the end of the previous turn and this one.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{jsonl, Growth, LoadOptions, PromptSpec, Session, Turn, Workload};
use crate::error::{ReplayError, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRow {
    pub session_id: String,
    pub turn: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time_s: Option<f64>,
    #[serde(default)]
    pub think_time_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_length: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append_length: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_prefix: Option<usize>,
    pub output_length: usize,
}

pub fn parse(path: &Path, text: &str, opts: &LoadOptions) -> Result<Workload> {
    let rows = jsonl::<SessionRow>(path, text)?;
    let mut w = from_rows(rows, opts.scale, &path.display().to_string())?;
    w.sessions.drain(..opts.skip.min(w.sessions.len()));
    Ok(w)
}

/// A workload from rows (read from a file or made by a generator); rows
/// with line numbers so errors can point at them.
pub fn from_rows(rows: Vec<(usize, SessionRow)>, scale: super::Scale, name: &str) -> Result<Workload> {
    let path = Path::new(name);
    let mut order: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, Vec<(usize, SessionRow)>> = HashMap::new();
    for (line, r) in rows {
        if !by_id.contains_key(&r.session_id) {
            order.push(r.session_id.clone());
        }
        by_id.entry(r.session_id.clone()).or_default().push((line, r));
    }
    let mut sessions = Vec::with_capacity(order.len());
    for id in order {
        let mut rows = by_id.remove(&id).unwrap_or_default();
        rows.sort_by_key(|(_, r)| r.turn);
        let start = rows[0].1.start_time_s.unwrap_or(0.0);
        let mut arrival = start;
        let mut turns = Vec::with_capacity(rows.len());
        for (i, (line, r)) in rows.into_iter().enumerate() {
            let growth = match (i, r.input_length, r.append_length) {
                (_, Some(_), Some(_)) => return Err(ReplayError::trace(path, line, "give input_length or append_length, not both")),
                (_, None, None) => return Err(ReplayError::trace(path, line, "give input_length or append_length")),
                (0, Some(n), None) | (0, None, Some(n)) => Growth::Input { len: scale.len(n), keep: Some(0) },
                (_, None, Some(n)) => Growth::Append(scale.len(n)),
                (_, Some(n), None) => Growth::Input { len: scale.len(n), keep: r.keep_prefix.map(|k| scale.len(k)) },
            };
            if r.think_time_s < 0.0 || !r.think_time_s.is_finite() {
                return Err(ReplayError::trace(path, line, "think_time_s must be a non-negative number"));
            }
            if i > 0 {
                arrival += r.think_time_s;
            }
            turns.push(Turn {
                turn: r.turn,
                arrival_s: arrival,
                think_s: if i == 0 { 0.0 } else { r.think_time_s },
                prompt: PromptSpec::Grow(growth),
                output_tokens: scale.len(r.output_length.max(1)),
            });
        }
        sessions.push(Session { id: Some(id), turns });
    }
    sessions.sort_by(|a, b| a.turns[0].arrival_s.total_cmp(&b.turns[0].arrival_s));
    Ok(Workload { source: format!("session:{name} (scale {scale})"), sessions })
}

/// Writes rows as JSONL.
pub fn write(path: &Path, rows: &[SessionRow]) -> Result<()> {
    let mut out = Vec::new();
    for r in rows {
        serde_json::to_writer(&mut out, r)?;
        out.push(b'\n');
    }
    std::fs::File::create(path).and_then(|mut f| f.write_all(&out)).map_err(|e| ReplayError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_grow_by_append_or_are_cut_by_keep_prefix() {
        let text = r#"{"session_id": "b", "turn": 0, "start_time_s": 5, "input_length": 100, "output_length": 10}
{"session_id": "a", "turn": 1, "think_time_s": 2.5, "append_length": 64, "output_length": 8}
{"session_id": "a", "turn": 0, "input_length": 200, "output_length": 10}
{"session_id": "a", "turn": 2, "think_time_s": 1.0, "input_length": 300, "keep_prefix": 50, "output_length": 8}"#;
        let w = parse(Path::new("s.jsonl"), text, &LoadOptions::default()).unwrap();
        assert_eq!(w.sessions.iter().map(|s| s.id.clone().unwrap()).collect::<Vec<_>>(), ["a", "b"]);
        let a = &w.sessions[0].turns;
        assert_eq!(a[0].prompt, PromptSpec::Grow(Growth::Input { len: 200, keep: Some(0) }));
        assert_eq!(a[1].prompt, PromptSpec::Grow(Growth::Append(64)));
        assert_eq!(a[2].prompt, PromptSpec::Grow(Growth::Input { len: 300, keep: Some(50) }));
        assert_eq!((a[1].think_s, a[2].arrival_s), (2.5, 3.5));
        assert_eq!(w.sessions[1].turns[0].arrival_s, 5.0);
    }

    #[test]
    fn a_turn_with_both_lengths_is_refused_with_its_line() {
        let text = "{\"session_id\": \"a\", \"turn\": 0, \"input_length\": 2, \"append_length\": 3, \"output_length\": 1}";
        let err = parse(Path::new("s.jsonl"), text, &LoadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("s.jsonl:1") && err.contains("not both"), "{err}");
    }

    #[test]
    fn rows_round_trip_through_the_writer() {
        let rows = vec![SessionRow {
            session_id: "x".into(),
            turn: 0,
            start_time_s: Some(1.5),
            think_time_s: 0.0,
            input_length: Some(10),
            append_length: None,
            keep_prefix: None,
            output_length: 3,
        }];
        let dir = std::env::temp_dir().join(format!("kvc-replay-session-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("rows.jsonl");
        write(&p, &rows).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let back: Vec<SessionRow> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(back, rows);
        std::fs::remove_dir_all(&dir).ok();
    }
}
