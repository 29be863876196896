//! Mooncake FAST'25 traces: one JSON object per request,
//! `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`,
//! where each hash id names one 512-token block of the prompt and equal
//! ids mean equal prefixes. Requests are independent (no session id); the
//! reuse they show is prefix-cache reuse.

use std::path::Path;

use serde::Deserialize;

use super::{jsonl, HashBlocks, LoadOptions, Session, Turn, Workload};
use crate::error::Result;

pub const BLOCK_TOKENS: usize = 512;

#[derive(Debug, Deserialize)]
struct Row {
    timestamp: f64,
    input_length: usize,
    output_length: usize,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

pub fn parse(path: &Path, text: &str, opts: &LoadOptions) -> Result<Workload> {
    let blocks = HashBlocks::new(opts, BLOCK_TOKENS)?;
    let rows: Vec<(usize, Row)> = jsonl(path, text)?.into_iter().skip(opts.skip).collect();
    let t0 = rows.iter().map(|(_, r)| r.timestamp).fold(f64::INFINITY, f64::min);
    let mut sessions = Vec::with_capacity(rows.len());
    for (line, r) in rows {
        let (prompt, output_tokens) = blocks.request(path, line, r.input_length, r.output_length, r.hash_ids)?;
        let turn = Turn { turn: 0, arrival_s: (r.timestamp - t0) / 1000.0, think_s: 0.0, prompt, output_tokens };
        sessions.push(Session { id: None, turns: vec![turn] });
    }
    // Replay in arrival order even if the file is not sorted.
    sessions.sort_by(|a, b| a.turns[0].arrival_s.total_cmp(&b.turns[0].arrival_s));
    Ok(Workload { source: format!("mooncake:{} (scale {})", path.display(), opts.scale), sessions })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::PromptSpec;

    #[test]
    fn requests_keep_hash_structure_and_rebase_time_when_scaled() {
        let text = "{\"timestamp\": 1000, \"input_length\": 1100, \"output_length\": 64, \"hash_ids\": [7, 8, 9]}\n\
                    {\"timestamp\": 3500, \"input_length\": 1024, \"output_length\": 3, \"hash_ids\": [7, 8]}\n";
        let opts = LoadOptions { scale: "1/32".parse().unwrap(), ..Default::default() };
        let w = parse(Path::new("t.jsonl"), text, &opts).unwrap();
        assert_eq!(w.sessions.len(), 2);
        let t = &w.sessions[1].turns[0];
        assert_eq!(t.arrival_s, 2.5);
        assert_eq!(t.prompt, PromptSpec::Blocks { hash_ids: vec![7, 8], block_tokens: 16, len: 32 });
        assert_eq!(t.output_tokens, 1);
        // 2 whole blocks + a 76-token tail scaled to 2 tokens.
        assert!(matches!(w.sessions[0].turns[0].prompt, PromptSpec::Blocks { len: 34, .. }));
        assert_eq!(w.sessions[0].turns[0].output_tokens, 2);
        assert!(w.sessions.iter().all(|s| s.id.is_none()));
    }
}
