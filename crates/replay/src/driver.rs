//! Replays a [`Workload`] against an endpoint in real time (or
//! `time_scale` times faster): each session is a task; its first turn
//! starts at its trace arrival, and turn N+1 only after turn N has finished
//! plus its think time (`Pacing::Think`), or at its trace arrival if that
//! is later (`Pacing::Arrival`). At most `concurrency` requests are in
//! flight; a request held back by that cap is sent late and the delay is
//! recorded (`start_s - scheduled_s`), so an overloaded client shows.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch, Semaphore};

use crate::client::{Api, Endpoint};
use crate::metrics::{RequestRecord, Sent};
use crate::reuse::ReuseOracle;
use crate::scrape::{scrape_loop, ScrapeRow};
use crate::synth::prompt::SessionContext;
use crate::synth::tokens::TokenSynth;
use crate::trace::Workload;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pacing {
    /// Turn N+1 starts think time after turn N ends.
    Think,
    /// Turn N+1 starts at its trace arrival, or when turn N ends if later.
    Arrival,
}

impl std::str::FromStr for Pacing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "think" => Ok(Pacing::Think),
            "arrival" => Ok(Pacing::Arrival),
            _ => Err(format!("unknown pacing {s:?} (think, arrival)")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// 1-based run number, written in every row.
    pub run: usize,
    /// 1 = real time; 10 = ten times faster than the trace.
    pub time_scale: f64,
    pub concurrency: usize,
    pub request_timeout: Duration,
    pub pacing: Pacing,
    /// Seeds the prompt tokens; runs with different salts share no cache.
    pub salt: u64,
    /// Appended to session ids, so a run does not resume another's sessions.
    pub session_suffix: String,
    /// Block size of the client's own reuse count ([`ReuseOracle`]).
    pub reuse_block_tokens: usize,
    /// `None`: do not scrape /metrics.
    pub scrape_interval: Option<Duration>,
    pub progress: bool,
    /// Stop at Ctrl-C and keep what finished (the binary; not in tests,
    /// where a SIGINT handler would outlive the run).
    pub stop_on_ctrl_c: bool,
}

pub struct RunOutput {
    /// Sorted by send time.
    pub records: Vec<RequestRecord>,
    pub scrapes: Vec<ScrapeRow>,
    /// First send to last answer.
    pub wall_s: f64,
    pub started_unix_s: f64,
    /// Stopped by Ctrl-C before the workload ended.
    pub interrupted: bool,
}

#[derive(Default)]
struct Counters {
    done: AtomicUsize,
    errors: AtomicUsize,
    in_flight: AtomicUsize,
}

pub async fn run(workload: Arc<Workload>, endpoint: Arc<Endpoint>, cfg: DriverConfig) -> RunOutput {
    let t0 = Instant::now();
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let total = workload.requests();
    let sem = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
    let oracle = Arc::new(Mutex::new(ReuseOracle::new(cfg.reuse_block_tokens)));
    let counters = Arc::new(Counters::default());
    let (tx, mut rx) = mpsc::unbounded_channel::<RequestRecord>();

    let (stop_tx, stop_rx) = watch::channel(false);
    let scraper = cfg.scrape_interval.map(|iv| tokio::spawn(scrape_loop(endpoint.url.clone(), iv, t0, stop_rx.clone())));
    let progress = cfg.progress.then(|| tokio::spawn(progress_loop(counters.clone(), total, t0, stop_rx)));

    let mut tasks = Vec::with_capacity(workload.sessions.len());
    for si in 0..workload.sessions.len() {
        let (workload, endpoint, cfg) = (workload.clone(), endpoint.clone(), cfg.clone());
        let (sem, oracle, counters, tx) = (sem.clone(), oracle.clone(), counters.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let session = &workload.sessions[si];
            let synth = TokenSynth::new(cfg.salt);
            let mut ctx = SessionContext::new(synth, si as u64, endpoint.api == Api::Chat);
            let session_id = session.id.as_ref().map(|id| format!("{id}{}", cfg.session_suffix));
            let at = |trace_s: f64| t0 + Duration::from_secs_f64((trace_s / cfg.time_scale).max(0.0));
            let mut prev_end: Option<Instant> = None;
            for (i, turn) in session.turns.iter().enumerate() {
                let due = match (prev_end, cfg.pacing) {
                    (None, _) => at(turn.arrival_s),
                    (Some(end), Pacing::Think) => end + Duration::from_secs_f64((turn.think_s / cfg.time_scale).max(0.0)),
                    (Some(end), Pacing::Arrival) => end.max(at(turn.arrival_s)),
                };
                tokio::time::sleep_until(due.into()).await;
                let prompt = ctx.prompt(i, turn);
                let Ok(permit) = sem.acquire().await else {
                    return;
                };
                let start = Instant::now();
                let reusable = oracle.lock().map(|mut o| o.observe(&prompt.tokens)).unwrap_or(0);
                counters.in_flight.fetch_add(1, Ordering::Relaxed);
                let deadline = (start + cfg.request_timeout).into();
                let outcome = endpoint.stream(&prompt, turn.output_tokens, session_id.as_deref(), deadline).await;
                drop(permit);
                counters.in_flight.fetch_sub(1, Ordering::Relaxed);
                prev_end = Some(Instant::now());
                ctx.finish(i, turn, &outcome.text);
                let sent = Sent {
                    run: cfg.run,
                    session: session_id.clone(),
                    turn: turn.turn,
                    scheduled_s: due.saturating_duration_since(t0).as_secs_f64(),
                    start_s: start.duration_since(t0).as_secs_f64(),
                    prompt_tokens_sent: prompt.tokens.len() as u64,
                    reusable_tokens: reusable as u64,
                    expected_output_tokens: turn.output_tokens as u64,
                };
                let record = RequestRecord::new(sent, &outcome);
                if !record.ok {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                }
                counters.done.fetch_add(1, Ordering::Relaxed);
                if tx.send(record).is_err() {
                    return;
                }
            }
        }));
    }
    drop(tx);

    let mut records = Vec::with_capacity(total);
    let mut interrupted = false;
    let ctrl_c = async {
        if cfg.stop_on_ctrl_c {
            let _ = tokio::signal::ctrl_c().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Some(r) => records.push(r),
                None => break,
            },
            _ = &mut ctrl_c => {
                interrupted = true;
                for t in &tasks {
                    t.abort();
                }
                break;
            }
        }
    }
    let _ = stop_tx.send(true);
    let scrapes = match scraper {
        Some(h) => h.await.unwrap_or_default(),
        None => Vec::new(),
    };
    if let Some(p) = progress {
        let _ = p.await;
    }
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let first = records.first().map_or(0.0, |r| r.start_s);
    let last = records.iter().map(|r| r.start_s + r.latency_s).fold(0.0, f64::max);
    RunOutput { records, scrapes, wall_s: (last - first).max(0.0), started_unix_s, interrupted }
}

/// One status line on stderr: redrawn in place on a terminal, every 10 s
/// otherwise (logs).
async fn progress_loop(c: Arc<Counters>, total: usize, t0: Instant, mut stop: watch::Receiver<bool>) {
    let tty = std::io::stderr().is_terminal();
    let every = Duration::from_secs(if tty { 1 } else { 10 });
    let line = |c: &Counters| {
        let done = c.done.load(Ordering::Relaxed);
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width).min(width);
        format!(
            "[{}{}] {done}/{total} requests, {} in flight, {} errors, {:.0}s",
            "#".repeat(filled),
            "-".repeat(width - filled),
            c.in_flight.load(Ordering::Relaxed),
            c.errors.load(Ordering::Relaxed),
            t0.elapsed().as_secs_f64()
        )
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let mut err = std::io::stderr();
        let _ = if tty { write!(err, "\r{}\x1b[K", line(&c)) } else { writeln!(err, "{}", line(&c)) };
    }
    let _ = if tty { writeln!(std::io::stderr(), "\r{}\x1b[K", line(&c)) } else { writeln!(std::io::stderr(), "{}", line(&c)) };
}
