//! Runs cut short keep what they measured. Each request's row is appended
//! to `metrics.jsonl` when it ends, before its session's next turn goes
//! out, so a mock server that has seen turn N+1 arrive proves turn N's row
//! is on disk: the tests synchronise on those arrivals, never on sleeps.
//!
//! - SIGINT during the first of `--runs 3`: run-1/ and the top-level
//!   summary of the runs that ran are written, exit 0.
//! - SIGTERM mid-run: the finished rows, the request in flight as a `cut`
//!   row (not an error), and a summary counting both.
//! - `kill -9` mid-run: the finished rows are on disk, and `kvc-replay
//!   report` builds the summary from them (and from the rows alone).
//! - `--duration-s`: each run stops on time against a server that never
//!   answers, with a partial report.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{read_json, read_rows, replay, scratch};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A server that answers its first `answered` completions (two output
/// chunks, a finish, `[DONE]`) and never answers the later ones; each
/// request is announced on `arrived` first.
async fn start_mock(answered: usize) -> (String, mpsc::UnboundedReceiver<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(AtomicUsize::new(0));
    let completions = move |_body: Bytes| {
        let (tx, seen) = (tx.clone(), seen.clone());
        async move {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(());
            if n >= answered {
                std::future::pending::<()>().await;
            }
            let chunk = |text: &str, finish: Option<&str>| {
                format!("data: {}\n\n", json!({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}))
            };
            let events = [chunk(" a", None), chunk(" b", None), chunk("", Some("length")), "data: [DONE]\n\n".to_string()];
            let stream = futures::stream::iter(events.map(|e| Ok::<_, std::convert::Infallible>(Bytes::from(e))));
            ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
        }
    };
    let app = Router::new()
        .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "mock-model"}]})) }))
        .route("/v1/completions", post(completions));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, rx)
}

/// `kvc-replay run` on microbench sessions (no think time) against `url`.
fn start_replay(url: &str, out: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kvc-replay"))
        .args(["run", "--url", url, "--out", &out.display().to_string(), "--no-progress"])
        .args(["--synth", "microbench", "--micro-first", "50", "--micro-append", "10", "--micro-output", "4"])
        .args(["--micro-gap-s", "0", "--scrape-interval-s", "0", "--wait-ready-s", "10"])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .expect("start kvc-replay")
}

async fn arrivals(arrived: &mut mpsc::UnboundedReceiver<()>, n: usize) {
    for _ in 0..n {
        arrived.recv().await.expect("a request reaches the mock");
    }
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill").args([sig, &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
}

async fn wait(child: Child) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap().status
}

fn count(rows: &[Value], f: impl Fn(&Value) -> bool) -> usize {
    rows.iter().filter(|r| f(r)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_in_the_first_of_several_runs_still_writes_a_summary() {
    let (url, mut arrived) = start_mock(0).await;
    let out = scratch("interrupted-runs");
    let child = start_replay(&url, &out, &["--runs", "3", "--sessions", "2", "--micro-turns", "2"]);
    // The first request is in flight (and will never finish): interrupt.
    arrivals(&mut arrived, 1).await;
    signal(&child, "-INT");
    let status = wait(child).await;
    assert!(status.success(), "kvc-replay exited with {status}");

    assert!(out.join("run-1/summary.json").is_file());
    assert!(!out.join("run-2").exists(), "no run after the interrupted one");
    let top = read_json(&out.join("summary.json"));
    assert_eq!((top["runs"].as_u64(), &top["run_dirs"]), (Some(1), &json!(["run-1"])), "{top}");
    assert_eq!((&top["meta"]["interrupted"], &top["meta"]["stop_reason"]), (&json!(true), &json!("signal")), "{top}");
    assert!(out.join("summary.md").is_file());
    std::fs::remove_dir_all(&out).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_keeps_the_finished_rows_and_counts_the_cut_one_apart() {
    // One session of 3 turns: turns 0 and 1 are answered, turn 2 hangs.
    let (url, mut arrived) = start_mock(2).await;
    let out = scratch("sigterm");
    let child = start_replay(&url, &out, &["--sessions", "1", "--micro-turns", "3"]);
    arrivals(&mut arrived, 3).await;
    signal(&child, "-TERM");
    let status = wait(child).await;
    assert!(status.success(), "kvc-replay exited with {status}");

    let rows = read_rows(&out.join("metrics.jsonl"));
    assert_eq!(rows.len(), 3, "{rows:?}");
    let finished: Vec<u64> = rows.iter().filter(|r| r["ok"] == true).map(|r| r["turn"].as_u64().unwrap()).collect();
    assert_eq!(finished, [0, 1], "{rows:?}");
    assert!(rows.iter().all(|r| r["ok"] == false || r["output_tokens"] == 2), "{rows:?}");
    let cut = &rows[2];
    assert_eq!((&cut["turn"], &cut["cut"], &cut["ok"], &cut["error"]), (&json!(2), &json!(true), &json!(false), &Value::Null), "{cut}");

    let s = read_json(&out.join("summary.json"));
    let counts = [&s["requests"], &s["ok"], &s["errors"], &s["cut"]].map(|v| v.as_u64());
    assert_eq!(counts, [Some(3), Some(2), Some(0), Some(1)], "{s}");
    assert_eq!(s["error_rate"], 0.0, "a cut request is not an error");
    assert_eq!(s["path_mix"]["cut"]["count"], 1, "{s}");
    assert_eq!((&s["meta"]["interrupted"], &s["meta"]["stop_reason"]), (&json!(true), &json!("signal")), "{s}");
    assert_eq!(read_json(&out.join("run.json")), s["meta"], "run.json holds the final description");
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("1 cut in flight") && md.contains("interrupted"), "{md}");
    std::fs::remove_dir_all(&out).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_rows_are_on_disk_and_report_rebuilds_the_summary_from_them() {
    let (url, mut arrived) = start_mock(2).await;
    let out = scratch("kill-9");
    let mut child = start_replay(&url, &out, &["--sessions", "1", "--micro-turns", "3"]);
    // Turn 2 has arrived, so turns 0 and 1 were written before it was sent.
    arrivals(&mut arrived, 3).await;
    child.kill().expect("kill -9");
    let _ = wait(child).await;

    assert!(!out.join("summary.json").exists(), "killed before any summary");
    let rows = read_rows(&out.join("metrics.jsonl"));
    assert_eq!(
        rows.iter().map(|r| (r["turn"].as_u64(), r["ok"].as_bool())).collect::<Vec<_>>(),
        [(Some(0), Some(true)), (Some(1), Some(true))]
    );
    assert_eq!(read_json(&out.join("run.json"))["requests_planned"], 3, "the description was written at the start");

    // A kill in the middle of a row's write leaves half a line: skipped.
    std::fs::OpenOptions::new()
        .append(true)
        .open(out.join("metrics.jsonl"))
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(br#"{"run": 1, "session": "micro-0"#)
        })
        .unwrap();
    let dir = out.display().to_string();
    let md = tokio::task::spawn_blocking(move || replay(&["report", &dir])).await.unwrap();
    assert!(md.contains("interrupted"), "{md}");
    let s = read_json(&out.join("summary.json"));
    let counts = [&s["requests"], &s["ok"], &s["errors"], &s["cut"]].map(|v| v.as_u64());
    assert_eq!(counts, [Some(2), Some(2), Some(0), Some(0)], "{s}");
    assert!(s["meta"]["workload"].as_str().unwrap().contains("microbench"), "from run.json: {s}");
    assert_eq!(s["meta"]["interrupted"], true, "2 rows of 3 planned: {s}");
    assert!(s["meta"]["wall_s"].as_f64().unwrap() > 0.0, "measured from the rows: {s}");
    assert!(out.join("summary.md").is_file() && out.join("latency_over_time.svg").is_file());

    // With the rows alone, the description is inferred from them.
    for f in ["run.json", "summary.json", "summary.md"] {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    let dir = out.display().to_string();
    let md = tokio::task::spawn_blocking(move || replay(&["report", &dir])).await.unwrap();
    assert!(md.contains("**unknown**"), "{md}");
    let s = read_json(&out.join("summary.json"));
    assert_eq!((s["requests"].as_u64(), &s["meta"]["workload"], &s["meta"]["inferred"]), (Some(2), &json!("unknown"), &json!(true)), "{s}");
    std::fs::remove_dir_all(&out).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_s_ends_each_run_against_a_server_that_never_answers() {
    let (url, _arrived) = start_mock(0).await;
    let out = scratch("duration");
    let child = start_replay(&url, &out, &["--sessions", "2", "--micro-turns", "2", "--runs", "2", "--duration-s", "0.5"]);
    let status = wait(child).await;
    assert!(status.success(), "kvc-replay exited with {status}");

    for run in ["run-1", "run-2"] {
        let s = read_json(&out.join(run).join("summary.json"));
        let (requests, cut) = (s["requests"].as_u64().unwrap(), s["cut"].as_u64().unwrap());
        assert!(requests >= 1 && cut == requests && s["errors"] == 0 && s["ok"] == 0, "{run}: {s}");
        assert_eq!((&s["meta"]["interrupted"], &s["meta"]["stop_reason"]), (&json!(true), &json!("duration")), "{run}: {s}");
        assert!(s["meta"]["wall_s"].as_f64().unwrap() >= 0.5 - 1e-6, "cut at 0.5 s after the first send: {s}");
        let rows = read_rows(&out.join(run).join("metrics.jsonl"));
        assert_eq!(count(&rows, |r| r["cut"] == true), rows.len());
    }
    let top = read_json(&out.join("summary.json"));
    assert_eq!((top["runs"].as_u64(), &top["meta"]["stop_reason"]), (Some(2), &json!("duration")), "{top}");
    std::fs::remove_dir_all(&out).ok();
}
