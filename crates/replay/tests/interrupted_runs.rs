//! `--runs N` cut short by SIGINT during its first run: the results so far
//! are written (run-1/ and the top-level summary of the runs that ran), and
//! the tool exits 0. Before, the top-level summary was only written for two
//! or more runs, and reading it failed.

mod common;

use std::process::Command;

use axum::routing::{get, post};
use axum::{Json, Router};
use common::{read_json, scratch};
use serde_json::json;
use tokio::sync::mpsc;

/// A server whose completions never answer; each request is announced on
/// `arrived` first.
async fn start_hanging_mock() -> (String, mpsc::UnboundedReceiver<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = Router::new().route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "mock-model"}]})) })).route(
        "/v1/completions",
        post(move || {
            let tx = tx.clone();
            async move {
                let _ = tx.send(());
                std::future::pending::<()>().await;
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_in_the_first_of_several_runs_still_writes_a_summary() {
    let (url, mut arrived) = start_hanging_mock().await;
    let out = scratch("interrupted-runs");
    let child = Command::new(env!("CARGO_BIN_EXE_kvc-replay"))
        .args(["run", "--url", &url, "--out", &out.display().to_string(), "--runs", "3", "--no-progress"])
        .args(["--synth", "microbench", "--sessions", "2", "--micro-turns", "2", "--micro-first", "50"])
        .args(["--micro-output", "4", "--scrape-interval-s", "0", "--wait-ready-s", "10"])
        .spawn()
        .expect("start kvc-replay");
    // The first request is in flight (and will never finish): interrupt.
    arrived.recv().await.expect("a request reaches the mock");
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill -INT");
    assert!(status.success());
    let out_status = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap().status;
    assert!(out_status.success(), "kvc-replay exited with {out_status}");

    assert!(out.join("run-1/summary.json").is_file());
    assert!(!out.join("run-2").exists(), "no run after the interrupted one");
    let top = read_json(&out.join("summary.json"));
    assert_eq!((top["runs"].as_u64(), &top["run_dirs"]), (Some(1), &json!(["run-1"])), "{top}");
    assert_eq!(top["meta"]["interrupted"], true, "{top}");
    assert!(out.join("summary.md").is_file());
}
