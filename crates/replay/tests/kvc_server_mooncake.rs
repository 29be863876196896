//! Replaying a slice of the Mooncake trace against a real kvc-server: no
//! errors, and the prefix reuse the server reports is the reuse the
//! trace's hash ids imply, computed here independently of the crate.

mod common;

use std::collections::HashSet;

use common::{read_json, read_rows, replay, scratch, KvcServer, MOONCAKE_SLICE};
use serde_json::Value;

/// Scale 1/32 turns 512-token hash blocks into 16-token blocks: one kvc
/// KV block each, so block boundaries stay aligned.
const HASH_BLOCK: u64 = 512;
const SCALE_DOWN: u64 = 32;
const KV_BLOCK: u64 = 16;

/// Expected cached / prompt tokens over the slice, sent one at a time in
/// order: a request reuses its leading hash blocks whose whole prefix
/// (chain of ids) an earlier request sent, except the block holding its
/// last token, which a server must compute. Lengths are scaled as the
/// crate README documents: whole blocks 512 -> 16 tokens, a partial tail
/// rounded, at least one token.
fn expected_reuse_from_hash_ids(text: &str) -> f64 {
    let mut seen: HashSet<Vec<u64>> = HashSet::new();
    let (mut cached, mut total) = (0u64, 0u64);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let ids: Vec<u64> = v["hash_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let input = v["input_length"].as_u64().unwrap();
        let (full, rem) = (input / HASH_BLOCK, input % HASH_BLOCK);
        let tail = if rem == 0 { 0 } else { ((rem as f64 / SCALE_DOWN as f64).round() as u64).clamp(1, KV_BLOCK) };
        let len = full * KV_BLOCK + tail;
        let hit = (1..=ids.len()).take_while(|&k| seen.contains(&ids[..k])).count() as u64;
        for k in 1..=ids.len() {
            seen.insert(ids[..k].to_vec());
        }
        cached += hit.min((len - 1) / KV_BLOCK) * KV_BLOCK;
        total += len;
    }
    cached as f64 / total as f64
}

#[test]
fn mooncake_slice_replays_without_errors_and_reuse_matches_the_trace_hash_structure() {
    let server = KvcServer::start(&[]);
    let out = scratch("mooncake");
    let out_s = out.to_str().unwrap();
    // Real time; one request at a time so that "sent before" is "finished
    // before" and the expected reuse is exact (concurrent requests sharing
    // a prefix may both miss).
    replay(&[
        "run",
        "--url",
        &server.url,
        "--trace",
        MOONCAKE_SLICE,
        "--scale",
        "1/32",
        "--concurrency",
        "1",
        "--request-timeout-s",
        "60",
        "--no-progress",
        "--out",
        out_s,
    ]);
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["requests"], 43);
    assert_eq!(summary["errors"], 0, "errors: {}", summary["top_errors"]);
    assert_eq!(summary["meta"]["time_scale"], 1.0);

    let expected = expected_reuse_from_hash_ids(&std::fs::read_to_string(MOONCAKE_SLICE).unwrap());
    let measured = summary["reuse_ratio"].as_f64().expect("kvc-server reports cached tokens");
    assert!(expected > 0.5, "the slice was chosen for its sharing: {expected}");
    assert!((measured - expected).abs() < 0.03, "server reuse {measured:.4} vs hash structure {expected:.4}");

    // Every row carries kvc's serving path, and the report files exist.
    let rows = read_rows(&out.join("metrics.jsonl"));
    assert_eq!(rows.len(), 43);
    assert!(rows.iter().all(|r| r["path"].is_string() && r["cached_tokens"].is_u64()), "{:?}", rows[0]);
    for f in ["summary.md", "ttft_cdf.svg", "latency_over_time.svg", "pool_usage.svg", "scrape.jsonl"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("| time scale | 1 (real time) |"), "{md}");
    std::fs::remove_dir_all(&out).ok();
}
