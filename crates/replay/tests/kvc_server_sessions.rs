//! A session workload against a real kvc-server: every turn after a
//! session's first is served partly from cache, and `--runs` reports a
//! median and spread.

mod common;

use common::{read_json, read_rows, replay, scratch, KvcServer};

#[test]
fn session_turns_after_the_first_report_cached_tokens() {
    let server = KvcServer::start(&[]);
    let out = scratch("sessions");
    replay(&[
        "run",
        "--url",
        &server.url,
        "--synth",
        "microbench",
        "--sessions",
        "2",
        "--micro-turns",
        "3",
        "--micro-first",
        "256",
        "--micro-append",
        "48",
        "--micro-output",
        "8",
        "--micro-gap-s",
        "0.2",
        "--concurrency",
        "4",
        "--runs",
        "2",
        "--request-timeout-s",
        "60",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ]);
    for run in ["run-1", "run-2"] {
        let rows = read_rows(&out.join(run).join("metrics.jsonl"));
        assert_eq!(rows.len(), 6, "{run}");
        assert!(rows.iter().all(|r| r["ok"] == true), "{rows:?}");
        for r in rows.iter().filter(|r| r["turn"].as_u64() > Some(0)) {
            let cached = r["cached_tokens"].as_u64().unwrap_or(0);
            assert!(cached > 0, "{run}: a later turn reused nothing: {r}");
            // The whole previous prompt is reusable; the stand-in for the
            // previous output and the append are not.
            assert!(cached >= r["reusable_tokens"].as_u64().unwrap() - 16, "{run}: {r}");
        }
        // Runs use their own session ids, so run 2 does not resume run 1's sessions.
        assert!(rows.iter().all(|r| r["session"].as_str().unwrap().ends_with(&format!("-r{}", &run[4..]))));
        // First turns share nothing with anything: cold.
        assert!(rows.iter().filter(|r| r["turn"] == 0).all(|r| r["cached_tokens"] == 0), "{rows:?}");
    }
    let agg = read_json(&out.join("summary.json"));
    assert_eq!((agg["kind"].as_str(), agg["runs"].as_u64()), (Some("runs"), Some(2)));
    let reuse = &agg["metrics"]["reuse_ratio"];
    assert!(reuse["median"].as_f64().unwrap() > 0.3, "{reuse}");
    assert_eq!(reuse["values"].as_array().unwrap().len(), 2);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("2 runs") && md.contains("spread"), "{md}");
    std::fs::remove_dir_all(&out).ok();
}
