//! `kvc-score`: reference prompt logprobs of the embedded model, for
//! checking a server's scoring from outside (scripts/lm_eval_check.sh).
//!
//! Reads JSON lines `{"tokens": [ids...]}` on stdin and writes one line
//! `{"logprobs": [...], "greedy": [...]}` each: `log p(tokens[i] |
//! tokens[..i])` for every i >= 1 and whether `tokens[i]` is the most
//! likely token there, from the model's plain forward pass over the whole
//! sequence (`kvc_engine::reference_score`), not from the engine loop.
//!
//!     kvc-score [--seed N] < requests.jsonl > logprobs.jsonl
//!
//! `--seed` must be the server's (default 0), which fills the embedded
//! model's dummy weights.

use std::io::{BufRead, Write};

use kvc_engine::reference_score::{embedded_model, reference_scores};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seed = match args.iter().position(|a| a == "--seed") {
        Some(i) => args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or_else(|| fail("--seed takes an integer")),
        None if args.len() > 1 => fail("usage: kvc-score [--seed N] < requests.jsonl"),
        None => 0,
    };
    let model = embedded_model(seed).unwrap_or_else(|e| fail(&e.to_string()));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap_or_else(|e| fail(&e.to_string()));
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| fail(&format!("bad JSON line: {e}")));
        let tokens: Vec<u32> = v["tokens"]
            .as_array()
            .and_then(|a| a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect())
            .unwrap_or_else(|| fail("each line needs \"tokens\": a list of token ids"));
        let scores = reference_scores(&model, &tokens).unwrap_or_else(|e| fail(&e.to_string()));
        let (logprobs, greedy): (Vec<f64>, Vec<bool>) = scores.into_iter().unzip();
        writeln!(out, "{}", serde_json::json!({ "logprobs": logprobs, "greedy": greedy })).unwrap_or_else(|e| fail(&e.to_string()));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("kvc-score: {msg}");
    std::process::exit(2)
}
