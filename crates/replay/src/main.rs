//! `kvc-replay`: replay traces against an OpenAI-compatible endpoint.
//! See the crate README for formats, flags and what the numbers mean.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use kvc_replay::client::{first_model, Api, Endpoint};
use kvc_replay::driver::{self, DriverConfig};
use kvc_replay::http::{self, BaseUrl};
use kvc_replay::pacing::Pacing;
use kvc_replay::reuse::ReuseOracle;
use kvc_replay::run_dir::{self, RunFiles};
use kvc_replay::run_meta::RunMeta;
use kvc_replay::runs::Aggregate;
use kvc_replay::stop::{self, StopReason};
use kvc_replay::summary::Summary;
use kvc_replay::synth::agentic::{self, AgenticShape};
use kvc_replay::synth::microbench::{self, MicroShape};
use kvc_replay::synth::prompt::SessionContext;
use kvc_replay::synth::rng::mix_all;
use kvc_replay::synth::tokens::TokenSynth;
use kvc_replay::synth::ShapeStats;
use kvc_replay::trace::session::{self as session_trace, SessionRow};
use kvc_replay::trace::{self, Format, LoadOptions, Scale, Workload};
use kvc_replay::{compare, report};

#[derive(Parser)]
#[command(name = "kvc-replay", version, about = "Replay real and synthetic multi-turn traces against an OpenAI-compatible endpoint")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Replay a trace or a synthetic workload and write a report.
    Run(RunArgs),
    /// Write a synthetic workload in kvc's session format and print its shape.
    Synth(SynthArgs),
    /// Print a trace's size and the reuse its structure allows (no server).
    Inspect(InspectArgs),
    /// Rebuild a result directory's summaries and plots from its rows alone (also a run killed before it wrote them).
    Report { dir: PathBuf },
    /// Side-by-side table of result directories.
    Compare {
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct InspectArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Also write the prefill each request asks for, one line per request
    /// in arrival order: "cached new" (tokens reusable from earlier
    /// requests, tokens to compute); what `kvc-bench engine --prefill-mix`
    /// measures the prefill capacity on.
    #[arg(long)]
    prefill_mix: Option<PathBuf>,
    /// Only every Nth request goes into --prefill-mix (a systematic sample).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    mix_every: u64,
}

#[derive(Args, Clone)]
struct SourceArgs {
    /// Trace file (Mooncake, Bailian or session JSONL).
    #[arg(long, conflicts_with = "synth")]
    trace: Option<PathBuf>,
    /// Trace format; default: told from the first line.
    #[arg(long)]
    format: Option<Format>,
    /// Synthetic workload instead of a trace: agentic (seed 003's SWE-bench shape) or microbench.
    #[arg(long, value_parser = ["agentic", "microbench"])]
    synth: Option<String>,
    #[command(flatten)]
    shape: ShapeArgs,
    /// Tokens per hash id (Mooncake 512, Bailian 16 by default).
    #[arg(long)]
    block_size: Option<usize>,
    /// Skip this many requests (Mooncake) or sessions first.
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Keep at most this many sessions (Mooncake: requests).
    #[arg(long)]
    max_sessions: Option<usize>,
    /// Keep at most this many turns per session.
    #[arg(long)]
    max_turns: Option<usize>,
    /// Block size of the client's reusable-prefix count.
    #[arg(long, default_value_t = 16)]
    reuse_block_tokens: usize,
}

#[derive(Args, Clone)]
struct ShapeArgs {
    /// Multiply lengths (and synthetic session counts) by this: 0.1 or 1/32.
    /// Hash-block traces need block x scale to be whole (1/32 -> 16-token blocks).
    #[arg(long, default_value = "1")]
    scale: Scale,
    /// Seed of the synthetic workload and of the prompt tokens.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Synthetic: number of sessions (after --scale).
    #[arg(long)]
    sessions: Option<usize>,
    /// microbench: turns per session.
    #[arg(long, default_value_t = 3)]
    micro_turns: usize,
    /// microbench: first prompt tokens (before --scale).
    #[arg(long, default_value_t = 10_000)]
    micro_first: usize,
    /// microbench: tokens appended per turn (before --scale).
    #[arg(long, default_value_t = 1_000)]
    micro_append: usize,
    /// microbench: output tokens per turn (before --scale).
    #[arg(long, default_value_t = 1_000)]
    micro_output: usize,
    /// microbench: think time between turns.
    #[arg(long, default_value_t = 1.0)]
    micro_gap_s: f64,
    /// agentic: probability that a turn appends a large tool output.
    #[arg(long)]
    large_append_prob: Option<f64>,
    /// agentic: sessions start at uniform times in [0, this) seconds
    /// (default 60, the seed trace's 50 sessions). To cut the workload to
    /// fewer sessions at the trace's arrival rate, scale it with --sessions
    /// (e.g. 6 sessions: 60 * 6 / 50 = 7.2).
    #[arg(long)]
    arrival_window_s: Option<f64>,
}

#[derive(Args)]
struct SynthArgs {
    /// agentic or microbench.
    #[arg(value_parser = ["agentic", "microbench"])]
    kind: String,
    #[command(flatten)]
    shape: ShapeArgs,
    /// Keep at most this many turns per session.
    #[arg(long)]
    max_turns: Option<usize>,
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Server base URL (plain http); a trailing /v1 is fine.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: BaseUrl,
    #[arg(long, default_value = "completions")]
    api: Api,
    /// `model` field; default: the first id of GET /v1/models.
    #[arg(long)]
    model: Option<String>,
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Do not send the `session_id` body field (the x-session-id header still goes).
    #[arg(long)]
    no_session_field: bool,
    /// Do not send `ignore_eos` (for servers that refuse it; outputs may be shorter).
    #[arg(long)]
    no_ignore_eos: bool,
    /// 1 = real time (default); N = N times faster than the trace. Printed in every report.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// think: turn N+1 starts think time after turn N ends; arrival: at its trace time, if turn N is done.
    #[arg(long, default_value = "think")]
    pacing: Pacing,
    /// Most requests in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[arg(long, default_value_t = 600.0)]
    request_timeout_s: f64,
    /// Repeat the workload N times (fresh tokens and session ids each run) and report median and spread.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Same prompt tokens and session ids in every run (later runs then hit the cache of earlier ones).
    #[arg(long)]
    same_tokens_across_runs: bool,
    /// Scrape /metrics this often (0: never).
    #[arg(long, default_value_t = 1.0)]
    scrape_interval_s: f64,
    /// Wait this long for GET /health (or /v1/models) to answer 200 before starting.
    #[arg(long, default_value_t = 60.0)]
    wait_ready_s: f64,
    /// Output directory (default runs/replay-<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long)]
    no_progress: bool,
    /// Exit with status 2 when any request failed (requests cut by a stop are not failures).
    #[arg(long)]
    fail_on_errors: bool,
    /// Stop each run this many seconds after its first request went out:
    /// nothing more is sent, requests in flight are cut (rows with `cut: true`),
    /// and the report covers what was measured. As SIGINT and SIGTERM do, but
    /// those also end the remaining runs of --runs N.
    #[arg(long)]
    duration_s: Option<f64>,
}

fn synth_rows(kind: &str, a: &ShapeArgs, max_turns: Option<usize>) -> Vec<SessionRow> {
    let mut rows = match kind {
        "agentic" => {
            let mut shape = AgenticShape::default();
            if let Some(n) = a.sessions {
                // --sessions counts after scaling: undo the scale on the count.
                shape.sessions = ((n as f64) / a.scale.factor()).round().max(1.0) as usize;
            }
            if let Some(p) = a.large_append_prob {
                shape.large_append_prob = p;
            }
            if let Some(w) = a.arrival_window_s {
                shape.arrival_window_s = w.max(0.0);
            }
            agentic::generate(&shape, a.scale, a.seed)
        }
        _ => {
            let mut shape = MicroShape {
                turns: a.micro_turns,
                first_prompt: a.micro_first,
                append: a.micro_append,
                output: a.micro_output,
                gap_s: a.micro_gap_s,
                ..MicroShape::default()
            };
            if let Some(n) = a.sessions {
                shape.sessions = ((n as f64) / a.scale.factor()).round().max(1.0) as usize;
            }
            microbench::generate(&shape, a.scale)
        }
    };
    if let Some(n) = max_turns {
        rows.retain(|r| r.turn < n);
    }
    rows
}

fn workload(s: &SourceArgs) -> anyhow::Result<Workload> {
    let mut w = match (&s.trace, &s.synth) {
        (Some(path), _) => {
            let opts = LoadOptions { format: s.format, scale: s.shape.scale, block_size: s.block_size, skip: s.skip };
            trace::load(path, &opts)?
        }
        (None, Some(kind)) => {
            let rows = synth_rows(kind, &s.shape, None).into_iter().enumerate().map(|(i, r)| (i + 1, r)).collect();
            let mut w = session_trace::from_rows(rows, Scale::ONE, &format!("synth-{kind}"))?;
            w.source = format!("synthetic {kind} (scale {}, seed {})", s.shape.scale, s.shape.seed);
            w
        }
        (None, None) => bail!("give --trace FILE or --synth agentic|microbench"),
    };
    w.truncate(s.max_sessions, s.max_turns);
    if w.requests() == 0 {
        bail!("the workload has no requests");
    }
    Ok(w)
}

/// Polls /health (then /v1/models) until one answers 200.
async fn wait_ready(url: &BaseUrl, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        for path in ["/health", "/v1/models"] {
            if let Ok(Ok((200, _))) = tokio::time::timeout(Duration::from_secs(5), http::get(url, path, &[])).await {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            bail!("{url} did not answer 200 on /health or /v1/models within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    if !(a.time_scale > 0.0 && a.time_scale.is_finite()) {
        bail!("--time-scale must be a positive number");
    }
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if a.duration_s.is_some_and(|d| !(d > 0.0 && d.is_finite())) {
        bail!("--duration-s must be a positive number");
    }
    let w = Arc::new(workload(&a.source)?);
    wait_ready(&a.url, Duration::from_secs_f64(a.wait_ready_s.max(0.0))).await?;
    let model = match &a.model {
        Some(m) => Some(m.clone()),
        None => first_model(&a.url, a.api_key.as_deref()).await,
    };
    let endpoint = Arc::new(Endpoint {
        url: a.url.clone(),
        api: a.api,
        model: model.clone(),
        api_key: a.api_key.clone(),
        session_field: !a.no_session_field,
        ignore_eos: !a.no_ignore_eos,
    });
    let out_dir = a.out.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        PathBuf::from(format!("runs/replay-{now}"))
    });
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let limit = a.duration_s.map_or(String::new(), |d| format!(" | at most {d} s each"));
    eprintln!(
        "kvc-replay: {} ({} sessions, {} requests) -> {} | time scale {}{} | concurrency {} | {} run(s){limit} | out {}",
        w.source,
        w.sessions.len(),
        w.requests(),
        a.url,
        a.time_scale,
        if a.time_scale == 1.0 { " (real time)" } else { " (COMPRESSED)" },
        a.concurrency,
        a.runs,
        out_dir.display()
    );

    if a.runs > 1 {
        // An earlier result's aggregate would sit next to this run's rows
        // until the end; each run directory is cleared when its run starts.
        run_dir::clear_outputs(&out_dir)?;
    }
    // From here a signal stops the run (and the remaining runs) and writes
    // what was measured; before, it ends the process as usual.
    let signals = match stop::listen_for_signals() {
        Ok(rx) => Some(rx),
        Err(e) => {
            eprintln!("kvc-replay: warning: cannot listen for SIGINT/SIGTERM ({e}); a signal ends the run without a report");
            None
        }
    };
    let signalled = || signals.as_ref().is_some_and(|rx| *rx.borrow());

    let mut summaries = Vec::new();
    let mut run_dirs = Vec::new();
    for run in 1..=a.runs {
        if run > 1 && signalled() {
            break;
        }
        let independent = !a.same_tokens_across_runs;
        let salt = if independent { mix_all(&[a.source.shape.seed, run as u64]) } else { a.source.shape.seed };
        let cfg = DriverConfig {
            run,
            time_scale: a.time_scale,
            concurrency: a.concurrency,
            request_timeout: Duration::from_secs_f64(a.request_timeout_s),
            pacing: a.pacing,
            salt,
            session_suffix: if independent && a.runs > 1 { format!("-r{run}") } else { String::new() },
            reuse_block_tokens: a.source.reuse_block_tokens,
            scrape_interval: (a.scrape_interval_s > 0.0).then(|| Duration::from_secs_f64(a.scrape_interval_s)),
            progress: !a.no_progress,
            stop: signals.clone(),
            duration: a.duration_s.map(Duration::from_secs_f64),
        };
        // What is known before the first request goes out; the end of the
        // run (or `kvc-replay report` after a kill) completes it.
        let mut meta = RunMeta {
            tool: format!("kvc-replay {}", env!("CARGO_PKG_VERSION")),
            workload: w.source.clone(),
            endpoint: a.url.to_string(),
            api: a.api,
            model: model.clone(),
            time_scale: a.time_scale,
            pacing: a.pacing,
            concurrency: a.concurrency,
            request_timeout_s: a.request_timeout_s,
            run,
            runs: a.runs,
            salt,
            started_unix_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            wall_s: 0.0,
            interrupted: false,
            stop_reason: None,
            scrape_interval_s: (a.scrape_interval_s > 0.0).then_some(a.scrape_interval_s),
            reuse_block_tokens: a.source.reuse_block_tokens,
            requests_planned: w.requests(),
            inferred: false,
        };
        let dir = if a.runs == 1 { out_dir.clone() } else { out_dir.join(format!("run-{run}")) };
        let files = Arc::new(RunFiles::create(&dir, &meta)?);
        let out = driver::run(w.clone(), endpoint.clone(), cfg, Some(files)).await;
        (meta.started_unix_s, meta.wall_s) = (out.started_unix_s, out.wall_s);
        (meta.interrupted, meta.stop_reason) = (out.interrupted, out.stop_reason);
        let summary = Summary::new(meta, &out.records, &out.scrapes);
        report::write_run(&dir, &summary, &out.records, &out.scrapes)?;
        let stopped = match out.stop_reason {
            Some(StopReason::Signal) => " (stopped by a signal)",
            Some(StopReason::Duration) => " (stopped at --duration-s)",
            None => "",
        };
        eprintln!(
            "run {run}/{}{stopped}: {} requests, {} errors, {} cut, TTFT p50 {} s, latency p50 {} s, reuse {} -> {}",
            a.runs,
            summary.requests,
            summary.errors,
            summary.cut,
            report::fmt_opt(summary.ttft_s.p50, 3),
            report::fmt_opt(summary.latency_s.p50, 3),
            report::fmt_opt(summary.reuse_ratio, 3),
            dir.join("summary.md").display()
        );
        summaries.push(summary);
        run_dirs.push(format!("run-{run}"));
        if out.stop_reason == Some(StopReason::Signal) {
            break;
        }
    }
    // With --runs > 1 the runs' summary goes to the top level, however
    // many ran (an interrupted first run leaves just one).
    if a.runs > 1 {
        Aggregate::new(&summaries, run_dirs).write(&out_dir)?;
    }
    println!("{}", std::fs::read_to_string(out_dir.join("summary.md"))?);
    if a.fail_on_errors && summaries.iter().any(|s| s.errors > 0) {
        std::process::exit(2);
    }
    Ok(())
}

/// Sizes and the reuse the trace's own structure allows, in send order.
fn inspect(a: &InspectArgs) -> anyhow::Result<()> {
    let s = &a.source;
    let w = workload(s)?;
    let synth = TokenSynth::new(s.shape.seed);
    let mut oracle = ReuseOracle::new(s.reuse_block_tokens);
    // Requests in arrival order, each session's turns in order.
    let mut order: Vec<(f64, usize, usize)> = Vec::new();
    for (si, sess) in w.sessions.iter().enumerate() {
        let mut t = sess.turns.first().map_or(0.0, |t| t.arrival_s);
        for (i, turn) in sess.turns.iter().enumerate() {
            if i > 0 {
                t = t.max(turn.arrival_s).max(t + turn.think_s);
            }
            order.push((t, si, i));
        }
    }
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut ctxs: Vec<SessionContext> = (0..w.sessions.len()).map(|si| SessionContext::new(synth, si as u64, false)).collect();
    let (mut prompt, mut reusable, mut output) = (0usize, 0usize, 0usize);
    let mut mix = String::new();
    for (n, (_, si, i)) in order.into_iter().enumerate() {
        let turn = &w.sessions[si].turns[i];
        let p = ctxs[si].prompt(i, turn);
        prompt += p.tokens.len();
        let cached = oracle.observe(&p.tokens);
        reusable += cached;
        if (n as u64).is_multiple_of(a.mix_every) {
            mix += &format!("{cached} {}\n", p.tokens.len() - cached);
        }
        output += turn.output_tokens;
        ctxs[si].finish(i, turn, "");
    }
    if let Some(path) = &a.prefill_mix {
        std::fs::write(path, mix)?;
    }
    let span = w.sessions.iter().flat_map(|s| s.turns.iter().map(|t| t.arrival_s)).fold(0.0, f64::max);
    println!(
        "{}\n{} sessions, {} requests, {} prompt tokens, {} output tokens, last arrival {:.1} s\n\
         reusable ratio {:.4} (whole {}-token blocks already sent earlier, in arrival order)",
        w.source,
        w.sessions.len(),
        w.requests(),
        prompt,
        output,
        span,
        reusable as f64 / prompt.max(1) as f64,
        s.reuse_block_tokens
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run(a) => tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(a)),
        Cmd::Synth(a) => {
            let rows = synth_rows(&a.kind, &a.shape, a.max_turns);
            session_trace::write(&a.out, &rows)?;
            println!("{}", serde_json::to_string_pretty(&ShapeStats::of(&rows))?);
            eprintln!("wrote {} turns to {}", rows.len(), a.out.display());
            Ok(())
        }
        Cmd::Inspect(a) => inspect(&a),
        Cmd::Report { dir } => {
            report::rebuild(&dir)?;
            print!("{}", std::fs::read_to_string(dir.join("summary.md"))?);
            Ok(())
        }
        Cmd::Compare { dirs } => {
            let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
            print!("{}", compare::table(&dirs)?);
            Ok(())
        }
    }
}
