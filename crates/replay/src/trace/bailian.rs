//! Qwen-Bailian-style session traces: one JSON object per request,
//! `{"chat_id", "parent_chat_id" (-1 for a first turn), "timestamp" (s),
//! "input_length", "output_length", "turn", "hash_ids"}` with hash blocks
//! of a given size (`--block-size`, default 16). Requests chained by
//! `parent_chat_id` form a session; its id goes out as `session_id`.
//!
//! The trace gives arrival times, not think times: a turn's think time is
//! taken as the gap between its arrival and its parent's (`--pacing
//! arrival` instead keeps the trace's arrival times where the server
//! allows it).

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::{jsonl, HashBlocks, LoadOptions, Session, Turn, Workload};
use crate::error::{ReplayError, Result};

pub const BLOCK_TOKENS: usize = 16;

#[derive(Debug, Deserialize)]
struct Row {
    chat_id: serde_json::Value,
    #[serde(default)]
    parent_chat_id: serde_json::Value,
    timestamp: f64,
    input_length: usize,
    output_length: usize,
    #[serde(default)]
    turn: Option<usize>,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Ids may be numbers or strings; -1, null, "" and absent mean "no parent".
fn key(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::Number(n) if n.as_i64().is_some_and(|i| i < 0) => None,
        serde_json::Value::String(s) if s.is_empty() || s == "-1" => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

pub fn parse(path: &Path, text: &str, opts: &LoadOptions) -> Result<Workload> {
    let blocks = HashBlocks::new(opts, BLOCK_TOKENS)?;
    let rows = jsonl::<Row>(path, text)?;
    let t0 = rows.iter().map(|(_, r)| r.timestamp).fold(f64::INFINITY, f64::min);

    // Root of each chat: follow parent links (parents not in the file start a session).
    let parent: HashMap<String, Option<String>> =
        rows.iter().filter_map(|(_, r)| key(&r.chat_id).map(|id| (id, key(&r.parent_chat_id)))).collect();
    let root_of = |id: &str| -> String {
        let mut cur = id.to_string();
        for _ in 0..parent.len() + 1 {
            match parent.get(&cur).cloned().flatten() {
                Some(p) if parent.contains_key(&p) => cur = p,
                _ => break,
            }
        }
        cur
    };

    let mut order: Vec<String> = Vec::new();
    let mut by_root: HashMap<String, Vec<(usize, Row)>> = HashMap::new();
    for (line, r) in rows {
        let id = key(&r.chat_id).ok_or_else(|| ReplayError::trace(path, line, "chat_id is missing or negative"))?;
        let root = root_of(&id);
        if !by_root.contains_key(&root) {
            order.push(root.clone());
        }
        by_root.entry(root).or_default().push((line, r));
    }

    let mut sessions = Vec::new();
    for root in order.into_iter().skip(opts.skip) {
        let mut reqs = by_root.remove(&root).unwrap_or_default();
        reqs.sort_by(|a, b| a.1.timestamp.total_cmp(&b.1.timestamp).then(a.1.turn.cmp(&b.1.turn)));
        let mut turns = Vec::with_capacity(reqs.len());
        let mut prev_ts: Option<f64> = None;
        for (i, (line, r)) in reqs.into_iter().enumerate() {
            let (prompt, output_tokens) = blocks.request(path, line, r.input_length, r.output_length, r.hash_ids)?;
            turns.push(Turn {
                turn: r.turn.unwrap_or(i),
                arrival_s: r.timestamp - t0,
                think_s: prev_ts.map_or(0.0, |p| (r.timestamp - p).max(0.0)),
                prompt,
                output_tokens,
            });
            prev_ts = Some(r.timestamp);
        }
        sessions.push(Session { id: Some(format!("bailian-{root}")), turns });
    }
    sessions.sort_by(|a, b| a.turns[0].arrival_s.total_cmp(&b.turns[0].arrival_s));
    Ok(Workload { source: format!("bailian:{} (block {}, scale {})", path.display(), blocks.block, opts.scale), sessions })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::PromptSpec;

    #[test]
    fn parent_links_make_sessions_with_think_times() {
        let text = r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 40, "output_length": 5, "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 2, "parent_chat_id": -1, "timestamp": 11.0, "input_length": 20, "output_length": 5, "turn": 1, "hash_ids": [9, 10]}
{"chat_id": 3, "parent_chat_id": 1, "timestamp": 14.5, "input_length": 64, "output_length": 5, "turn": 2, "hash_ids": [1, 2, 3, 4]}
{"chat_id": 4, "parent_chat_id": 3, "timestamp": 20.0, "input_length": 80, "output_length": 5, "turn": 3, "hash_ids": [1, 2, 3, 4, 5]}"#;
        let w = parse(Path::new("b.jsonl"), text, &LoadOptions::default()).unwrap();
        assert_eq!(w.sessions.len(), 2);
        let s = &w.sessions[0];
        assert_eq!(s.id.as_deref(), Some("bailian-1"));
        assert_eq!(s.turns.iter().map(|t| t.turn).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(s.turns[1].think_s, 4.5);
        assert_eq!(s.turns[2].arrival_s, 10.0);
        assert_eq!(s.turns[2].prompt, PromptSpec::Blocks { hash_ids: vec![1, 2, 3, 4, 5], block_tokens: 16, len: 80 });
        assert_eq!(w.sessions[1].turns.len(), 1);
    }
}
