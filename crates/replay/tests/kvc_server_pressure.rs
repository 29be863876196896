//! Issue 29: agentic sessions whose KV outgrows the pool, against a real
//! kvc-server on the CPU (the embedded model): every turn finishes, the
//! engine never stalls (its watchdog counter stays 0 in every scrape), the
//! pool really was under pressure (sessions were demoted to the host tier
//! and restored), and once the sessions are deleted every block and host
//! slot is back. Before the fix the same workload parked the engine with
//! every turn waiting and nothing running.

mod common;

use common::{http_call, metric_samples, read_json, read_rows, replay, scratch, KvcServer};

/// The sum of the samples of `family` (any labels) in `samples`.
fn sum(samples: &[(String, f64)], family: &str) -> f64 {
    samples.iter().filter(|(k, _)| k == family || k.starts_with(&format!("{family}{{"))).map(|(_, v)| v).sum()
}

#[test]
fn agentic_sessions_larger_than_the_pool_all_finish_and_the_engine_never_stalls() {
    // 192 blocks of 16 tokens: 3,072 tokens of KV. The workload's 8
    // sessions reach ~900-2,800 tokens each (~12K in all), so sessions are
    // demoted and restored all the time; every single prompt fits the pool.
    let server = KvcServer::start(&["--num-kv-blocks", "192", "--swap-space", "0.05", "--max-num-batched-tokens", "512"]);
    let out = scratch("pressure");
    replay(&[
        "run",
        "--url",
        &server.url,
        "--synth",
        "agentic",
        "--scale",
        "0.03",
        "--sessions",
        "8",
        "--max-turns",
        "14",
        "--arrival-window-s",
        "2",
        "--seed",
        "11",
        "--time-scale",
        "5",
        "--scrape-interval-s",
        "0.5",
        // A stalled engine ends the run here with its turns cut, not a hang.
        "--duration-s",
        "600",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ]);
    let rows = read_rows(&out.join("metrics.jsonl"));
    assert_eq!(rows.len(), 8 * 14, "every turn was sent");
    let failed: Vec<_> = rows.iter().filter(|r| r["ok"] != true).collect();
    assert!(failed.is_empty(), "{} of {} turns did not finish: {failed:?}", failed.len(), rows.len());
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["meta"]["interrupted"], false, "{}", summary["meta"]);

    // The watchdog never fired, in any scrape of the run.
    let scrapes = read_rows(&out.join("scrape.jsonl"));
    assert!(scrapes.len() > 5, "the run was scraped");
    for s in &scrapes {
        let stalled: f64 = s["values"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("kvc_engine_stalled_steps_total"))
            .map(|(_, v)| v.as_f64().unwrap())
            .sum();
        assert_eq!(stalled, 0.0, "stalled steps at t = {} s", s["t_s"]);
    }

    let (status, text) = http_call(server.port, "GET", "/metrics");
    assert_eq!(status, 200);
    let m = metric_samples(&text);
    assert_eq!(sum(&m, "kvc_engine_stalled_steps_total"), 0.0);
    assert!(sum(&m, "kvc_evicted_blocks_total") > 0.0 && sum(&m, "kvc_host_restores_total") > 0.0, "no pressure: {text}");
    assert!(sum(&m, "kvc_session_hits_total") > 0.0);

    // Every session deleted: every block is free or in the prefix index,
    // every host slot free.
    for s in 0..8 {
        let (status, body) = http_call(server.port, "DELETE", &format!("/v1/sessions/agentic-{s:03}"));
        assert!(status == 200 || status == 404, "DELETE agentic-{s:03}: {status} {body}");
    }
    let (_, text) = http_call(server.port, "GET", "/metrics");
    let m = metric_samples(&text);
    let total = sum(&m, "kvc_kv_blocks_total");
    assert_eq!(sum(&m, "kvc_kv_blocks_free") + sum(&m, "kvc_kv_blocks_cached"), total, "blocks held after every session went");
    assert_eq!(sum(&m, "kvc_host_kv_blocks_free"), sum(&m, "kvc_host_kv_blocks_total"), "host slots held after every session went");
    assert_eq!(sum(&m, "kvc_requests_oldest_waiting_seconds"), 0.0);
    std::fs::remove_dir_all(&out).ok();
}
