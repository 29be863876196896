//! Replays a [`Workload`] against an endpoint in real time (or
//! `time_scale` times faster): each session is a task; its first turn
//! starts at its trace arrival, and turn N+1 only after turn N has finished
//! plus its think time (`Pacing::Think`), or at its trace arrival if that
//! is later (`Pacing::Arrival`). At most `concurrency` requests are in
//! flight; a request held back by that cap is sent late and the delay is
//! recorded (`start_s - scheduled_s`), so an overloaded client shows.
//!
//! A run ends when its workload does, or at a stop (a signal, or
//! `duration` after the first send): then nothing more is sent, and the
//! requests in flight are cut and recorded as such (`cut: true`, not
//! errors), so the report covers what was measured until then.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch, Semaphore};

use crate::client::{Api, Endpoint};
use crate::metrics::{span_s, RequestRecord, Sent};
use crate::pacing::Pacing;
use crate::reuse::ReuseOracle;
use crate::run_dir::RunFiles;
use crate::scrape::{scrape_loop, ScrapeRow};
use crate::stop::{stopped, StopReason};
use crate::synth::prompt::SessionContext;
use crate::synth::tokens::TokenSynth;
use crate::trace::Workload;

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
    /// Stop when this turns true (the binary: [`crate::stop::listen_for_signals`],
    /// SIGINT or SIGTERM); `None`: only the workload's end or `duration`
    /// stops the run.
    pub stop: Option<watch::Receiver<bool>>,
    /// Stop this long after the first request went out (`--duration-s`).
    pub duration: Option<Duration>,
}

pub struct RunOutput {
    /// Sorted by send time.
    pub records: Vec<RequestRecord>,
    pub scrapes: Vec<ScrapeRow>,
    /// First send to last answer (or cut).
    pub wall_s: f64,
    pub started_unix_s: f64,
    /// Stopped before the workload ended (`stop_reason` says why).
    pub interrupted: bool,
    pub stop_reason: Option<StopReason>,
}

#[derive(Default)]
struct Counters {
    done: AtomicUsize,
    errors: AtomicUsize,
    cut: AtomicUsize,
    in_flight: AtomicUsize,
}

/// Runs the workload to its end or to a stop (`cfg.stop`, `cfg.duration`).
/// At a stop nothing more is sent, and the requests in flight are cut:
/// each ends as a row with `cut: true` (what had arrived is kept). With
/// `files`, every row is appended to the run's directory as it is made
/// ([`RunFiles`]), a request's before its session's next turn is sent.
pub async fn run(workload: Arc<Workload>, endpoint: Arc<Endpoint>, cfg: DriverConfig, files: Option<Arc<RunFiles>>) -> RunOutput {
    let t0 = Instant::now();
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let total = workload.requests();
    let sem = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
    let oracle = Arc::new(Mutex::new(ReuseOracle::new(cfg.reuse_block_tokens)));
    let counters = Arc::new(Counters::default());
    let (tx, mut rx) = mpsc::unbounded_channel::<RequestRecord>();
    // `halt`: stop sending and cut what is in flight; `done`: every
    // session has ended, stop scraping and the progress line.
    let (halt_tx, halt_rx) = watch::channel(false);
    let (first_send_tx, mut first_send_rx) = watch::channel(None::<Instant>);
    let first_send_tx = Arc::new(first_send_tx);

    let (done_tx, done_rx) = watch::channel(false);
    let scraper = cfg.scrape_interval.map(|iv| {
        let files = files.clone();
        let on_row = move |row: &ScrapeRow| {
            if let Some(f) = &files {
                f.scrape(row);
            }
        };
        tokio::spawn(scrape_loop(endpoint.url.clone(), iv, t0, done_rx.clone(), on_row))
    });
    let progress = cfg.progress.then(|| tokio::spawn(progress_loop(counters.clone(), total, t0, done_rx)));

    for si in 0..workload.sessions.len() {
        let (workload, endpoint, cfg, files) = (workload.clone(), endpoint.clone(), cfg.clone(), files.clone());
        let (sem, oracle, counters, tx) = (sem.clone(), oracle.clone(), counters.clone(), tx.clone());
        let (mut halt, first_send) = (halt_rx.clone(), first_send_tx.clone());
        tokio::spawn(async move {
            let session = &workload.sessions[si];
            let synth = TokenSynth::new(cfg.salt);
            let mut ctx = SessionContext::new(synth, si as u64, endpoint.api == Api::Chat);
            let session_id = session.id.as_ref().map(|id| format!("{id}{}", cfg.session_suffix));
            let mut prev_end: Option<Instant> = None;
            for (i, turn) in session.turns.iter().enumerate() {
                let due = cfg.pacing.due(t0, cfg.time_scale, prev_end, turn);
                tokio::select! {
                    biased;
                    _ = stopped(Some(&mut halt)) => return,
                    _ = tokio::time::sleep_until(due.into()) => {}
                }
                let prompt = ctx.prompt(i, turn);
                let permit = tokio::select! {
                    biased;
                    _ = stopped(Some(&mut halt)) => return,
                    p = sem.acquire() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                if *halt.borrow() {
                    return;
                }
                let start = Instant::now();
                first_send.send_if_modified(|t| match t {
                    None => {
                        *t = Some(start);
                        true
                    }
                    Some(_) => false,
                });
                let reusable = oracle.lock().map(|mut o| o.observe(&prompt.tokens)).unwrap_or(0);
                counters.in_flight.fetch_add(1, Ordering::Relaxed);
                let deadline = (start + cfg.request_timeout).into();
                let outcome =
                    endpoint.stream_until(&prompt, turn.output_tokens, session_id.as_deref(), deadline, stopped(Some(&mut halt))).await;
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
                let counter = match (record.cut, record.ok) {
                    (true, _) => Some(&counters.cut),
                    (false, false) => Some(&counters.errors),
                    (false, true) => None,
                };
                if let Some(c) = counter {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                counters.done.fetch_add(1, Ordering::Relaxed);
                if let Some(f) = &files {
                    f.record(&record);
                }
                let cut = record.cut;
                if tx.send(record).is_err() || cut {
                    return;
                }
            }
        });
    }
    drop(tx);
    drop(first_send_tx);

    let mut records = Vec::with_capacity(total);
    let mut stop_reason = None;
    let mut stop_rx = cfg.stop.clone();
    let signal = stopped(stop_rx.as_mut());
    let duration_up = async {
        let Some(d) = cfg.duration else { return std::future::pending().await };
        let first = match first_send_rx.wait_for(Option::is_some).await {
            Ok(t) => *t,
            Err(_) => None,
        };
        match first {
            Some(first) => tokio::time::sleep_until((first + d).into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(signal, duration_up);
    // Until every session has ended: at a stop, each ends at once, its
    // request in flight (if any) as a cut row.
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Some(r) => records.push(r),
                None => break,
            },
            _ = &mut signal, if stop_reason.is_none() => {
                stop_reason = Some(StopReason::Signal);
                let _ = halt_tx.send(true);
            }
            _ = &mut duration_up, if stop_reason.is_none() => {
                stop_reason = Some(StopReason::Duration);
                let _ = halt_tx.send(true);
            }
        }
    }
    let _ = done_tx.send(true);
    let scrapes = match scraper {
        Some(h) => h.await.unwrap_or_default(),
        None => Vec::new(),
    };
    if let Some(p) = progress {
        let _ = p.await;
    }
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let wall_s = span_s(&records);
    RunOutput { records, scrapes, wall_s, started_unix_s, interrupted: stop_reason.is_some(), stop_reason }
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
        let cut = match c.cut.load(Ordering::Relaxed) {
            0 => String::new(),
            n => format!(", {n} cut"),
        };
        format!(
            "[{}{}] {done}/{total} requests, {} in flight, {} errors{cut}, {:.0}s",
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
