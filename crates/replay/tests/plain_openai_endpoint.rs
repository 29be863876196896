//! The same driver against an OpenAI-compatible server that knows nothing
//! of kvc: no `x-kvc-path`, no `kvc` field, no cached-token usage, no
//! /metrics, no /health. Replay must still finish, count output from the
//! stream, and say reuse is unknown rather than zero.

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{read_json, read_rows, replay, scratch};
use serde_json::{json, Value};

/// A request as the mock saw it: its `x-session-id` header and its body.
type Received = (Option<String>, Value);

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Received>>>);

/// `n` SSE chunks of one word each, a finish chunk, `[DONE]`; no usage.
fn sse(n: usize, chunk: impl Fn(&str, Option<&str>) -> Value) -> Response {
    let mut events: Vec<String> = (0..n).map(|i| format!("data: {}\n\n", chunk(&format!(" w{i}"), None))).collect();
    events.push(format!("data: {}\n\n", chunk("", Some("length"))));
    events.push("data: [DONE]\n\n".into());
    let stream = futures::stream::iter(events.into_iter().map(|e| Ok::<_, Infallible>(Bytes::from(e))));
    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
}

async fn completions(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let session = headers.get("x-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let n = body["max_tokens"].as_u64().unwrap_or(16) as usize;
    seen.0.lock().unwrap().push((session, body));
    sse(n, |text, finish| json!({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}))
}

async fn chat(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let session = headers.get("x-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let n = body["max_tokens"].as_u64().unwrap_or(16) as usize;
    seen.0.lock().unwrap().push((session, body));
    sse(n, |text, finish| {
        let delta = if text.is_empty() { json!({}) } else { json!({"content": text}) };
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    })
}

/// Serves the mock on a free port; returns its URL and what it received.
async fn start_mock() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "mock-model"}]})) }))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

const MICRO: &[&str] = &[
    "--synth",
    "microbench",
    "--sessions",
    "2",
    "--micro-turns",
    "2",
    "--micro-first",
    "100",
    "--micro-append",
    "20",
    "--micro-output",
    "5",
    "--micro-gap-s",
    "0.05",
    "--no-progress",
    "--scrape-interval-s",
    "0.2",
];

async fn run_replay(url: &str, out: &std::path::Path, extra: &[&str]) {
    let mut args: Vec<String> = vec!["run".into(), "--url".into(), url.into(), "--out".into(), out.display().to_string()];
    args.extend(MICRO.iter().chain(extra).map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || replay(&args.iter().map(String::as_str).collect::<Vec<_>>())).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_works_against_an_endpoint_without_kvc_extensions() {
    let (url, seen) = start_mock().await;
    let out = scratch("plain-completions");
    run_replay(&url, &out, &[]).await;

    let summary = read_json(&out.join("summary.json"));
    assert_eq!((summary["requests"].as_u64(), summary["errors"].as_u64()), (Some(4), Some(0)));
    assert!(summary["reuse_ratio"].is_null(), "no cached-token reports means unknown reuse");
    assert_eq!(summary["kvc_labelled"], 0);
    assert_eq!(summary["path_mix"]["unlabelled"]["count"], 4);
    assert_eq!(summary["meta"]["model"], "mock-model");
    let rows = read_rows(&out.join("metrics.jsonl"));
    // Output counted from the stream's chunks; TTFT and TPOT measured.
    assert!(rows.iter().all(|r| r["output_tokens"] == 5 && r["ttft_s"].is_f64() && r["tpot_s"].is_f64()), "{rows:?}");
    assert!(!out.join("pool_usage.svg").exists(), "no /metrics, no pool plot");

    // What the server received: the session id as body field and header,
    // token-id prompts, and a turn extending its session's previous prompt.
    let seen = seen.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    for (header, body) in &seen {
        assert_eq!(header.as_deref(), body["session_id"].as_str());
        assert!(header.as_deref().unwrap().starts_with("micro-"));
        assert_eq!((body["stream"].as_bool(), body["ignore_eos"].as_bool()), (Some(true), Some(true)));
        assert_eq!(body["model"], "mock-model");
    }
    let prompt = |sid: &str, len: usize| -> Vec<Value> {
        seen.iter()
            .find(|(h, b)| h.as_deref() == Some(sid) && b["prompt"].as_array().unwrap().len() == len)
            .map(|(_, b)| b["prompt"].as_array().unwrap().clone())
            .unwrap_or_else(|| panic!("no {len}-token prompt for {sid}"))
    };
    let (first, second) = (prompt("micro-000", 100), prompt("micro-000", 125));
    assert_eq!(first[..], second[..100], "turn 2 = turn 1 prompt + 5-token stand-in + 20 new");
    std::fs::remove_dir_all(&out).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_sessions_send_the_real_answer_back_in_the_history() {
    let (url, seen) = start_mock().await;
    let out = scratch("plain-chat");
    run_replay(&url, &out, &["--api", "chat", "--no-session-field"]).await;

    let summary = read_json(&out.join("summary.json"));
    assert_eq!((summary["requests"].as_u64(), summary["errors"].as_u64()), (Some(4), Some(0)));
    let seen = seen.0.lock().unwrap().clone();
    assert!(seen.iter().all(|(h, b)| h.is_some() && b.get("session_id").is_none()), "header only");
    let second_turn = seen.iter().find(|(_, b)| b["messages"].as_array().unwrap().len() == 3).expect("a second turn");
    let m = second_turn.1["messages"].as_array().unwrap();
    assert_eq!((m[0]["role"].as_str(), m[1]["role"].as_str(), m[2]["role"].as_str()), (Some("user"), Some("assistant"), Some("user")));
    assert_eq!(m[1]["content"], " w0 w1 w2 w3 w4");
    std::fs::remove_dir_all(&out).ok();
}

/// 1 output token asked: HTTP 500 with an OpenAI error body; 2: a stream
/// that stops mid-way and never ends; otherwise a normal stream.
async fn flaky(Json(body): Json<Value>) -> Response {
    match body["max_tokens"].as_u64() {
        Some(1) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": {"message": "engine exploded", "type": "internal_error"}})),
        )
            .into_response(),
        Some(2) => {
            let first = futures::stream::iter([Ok::<_, Infallible>(Bytes::from(
                "data: {\"choices\": [{\"index\": 0, \"text\": \" a\", \"finish_reason\": null}]}\n\n",
            ))]);
            let stream = futures::StreamExt::chain(first, futures::stream::pending());
            ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
        }
        _ => sse(3, |text, finish| json!({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_timed_out_requests_become_error_rows_and_the_run_finishes() {
    use kvc_replay::client::{Api, Endpoint};
    use kvc_replay::driver::{self, DriverConfig};
    use kvc_replay::pacing::Pacing;
    use kvc_replay::trace::{Growth, PromptSpec, Session, Turn, Workload};
    use std::time::{Duration, Instant};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, Router::new().route("/v1/completions", post(flaky))).await.unwrap() });

    let turn = |output_tokens| Turn {
        turn: 0,
        arrival_s: 0.0,
        think_s: 0.0,
        prompt: PromptSpec::Grow(Growth::Input { len: 32, keep: Some(0) }),
        output_tokens,
    };
    let workload = Workload { source: "test".into(), sessions: [1, 2, 3].map(|n| Session { id: None, turns: vec![turn(n)] }).to_vec() };
    let endpoint =
        Endpoint { url: url.parse().unwrap(), api: Api::Completions, model: None, api_key: None, session_field: true, ignore_eos: true };
    let cfg = DriverConfig {
        run: 1,
        time_scale: 1.0,
        concurrency: 8,
        request_timeout: Duration::from_millis(500),
        pacing: Pacing::Think,
        salt: 0,
        session_suffix: String::new(),
        reuse_block_tokens: 16,
        scrape_interval: None,
        progress: false,
        stop: None,
        duration: None,
    };
    let t0 = Instant::now();
    let out = driver::run(workload.into(), endpoint.into(), cfg, None).await;
    assert!(t0.elapsed() < Duration::from_secs(10), "the hung stream was not cut by the timeout");
    let by_output = |n: u64| out.records.iter().find(|r| r.expected_output_tokens == n).unwrap();
    let failed = by_output(1);
    assert_eq!((failed.ok, failed.status), (false, Some(500)));
    assert_eq!(failed.error.as_deref(), Some("HTTP 500: engine exploded"));
    let hung = by_output(2);
    assert!(!hung.ok && hung.error.as_deref().unwrap().contains("timed out"), "{hung:?}");
    assert!(hung.ttft_s.is_some(), "the part that arrived is still timed");
    let fine = by_output(3);
    assert!(fine.ok && fine.output_tokens == Some(3), "{fine:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_puts_directories_side_by_side_with_their_path_mix() {
    let (url, _) = start_mock().await;
    let one = scratch("compare-one");
    let two = scratch("compare-two");
    run_replay(&url, &one, &[]).await;
    run_replay(&url, &two, &["--runs", "2"]).await;
    let (a, b) = (one.display().to_string(), two.display().to_string());
    let md = tokio::task::spawn_blocking(move || replay(&["compare", &a, &b])).await.unwrap();
    let row = |name: &str| -> Vec<String> {
        let line = md.lines().find(|l| l.starts_with(&format!("| {name} |"))).unwrap_or_else(|| panic!("no {name} row in\n{md}"));
        line.trim_matches('|').split('|').skip(1).map(|c| c.trim().to_string()).collect()
    };
    assert_eq!(row("runs"), ["1", "2"]);
    assert_eq!(row("errors"), ["0", "0 [0–0]"]);
    // 4 requests a run, none labelled by this server: every run counted.
    assert_eq!(row("path mix (requests, all runs)"), ["unlabelled 4 (100 %)", "unlabelled 8 (100 %)"]);
}
