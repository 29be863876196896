//! A run's directory while the run goes on, and read back after it.
//!
//! Before the first request goes out, the directory holds `run.json` (the
//! [`RunMeta`] as known at the start: no wall time yet, not interrupted)
//! and an empty `metrics.jsonl`. Each request's row is appended to
//! `metrics.jsonl` when the request ends, before the session's next turn
//! is sent; each `/metrics` sample to `scrape.jsonl` when it is taken. So a
//! run cut short by a kill or a stalled server leaves every row it
//! finished, and `kvc-replay report DIR` rebuilds the summary from them.
//! At the end of the run the rows are rewritten in send order, `run.json`
//! gets the final description, and the summary and plots are written
//! ([`crate::report::write_run`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::client::Api;
use crate::error::Result;
use crate::jsonl::{write_atomic, Appender};
use crate::metrics::{span_s, RequestRecord};
use crate::pacing::Pacing;
use crate::run_meta::RunMeta;
use crate::scrape::ScrapeRow;
use crate::stats::median;

pub const RUN_JSON: &str = "run.json";
pub const METRICS: &str = "metrics.jsonl";
pub const SCRAPE: &str = "scrape.jsonl";
pub const SUMMARY_JSON: &str = "summary.json";
pub const SUMMARY_MD: &str = "summary.md";
pub const TTFT_PLOT: &str = "ttft_cdf.svg";
pub const LATENCY_PLOT: &str = "latency_over_time.svg";
pub const TTFT_TIME_PLOT: &str = "ttft_over_time.svg";
pub const POOL_PLOT: &str = "pool_usage.svg";

/// What a run writes into its directory; an earlier run's are removed when
/// a new one starts there, so a run cut short never leaves another run's
/// summary next to its rows.
const OUTPUTS: &[&str] = &[RUN_JSON, METRICS, SCRAPE, SUMMARY_JSON, SUMMARY_MD, TTFT_PLOT, TTFT_TIME_PLOT, LATENCY_PLOT, POOL_PLOT];

/// Removes what a run writes (see `OUTPUTS`) from `dir`, if there.
pub fn clear_outputs(dir: &Path) -> Result<()> {
    for name in OUTPUTS {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(crate::ReplayError::io(&dir.join(name), e)),
            _ => {}
        }
    }
    Ok(())
}

/// The rows files of a run in progress; shared by the driver's session
/// tasks and its scraper.
#[derive(Debug)]
pub struct RunFiles {
    dir: PathBuf,
    metrics: Mutex<Appender>,
    scrape: Mutex<Appender>,
    warned: AtomicBool,
}

impl RunFiles {
    /// Creates `dir`, clears an earlier run's files from it, writes
    /// `run.json` and an empty `metrics.jsonl`. `scrape.jsonl` appears
    /// with the first sample.
    pub fn create(dir: &Path, meta: &RunMeta) -> Result<RunFiles> {
        std::fs::create_dir_all(dir).map_err(|e| crate::ReplayError::io(dir, e))?;
        clear_outputs(dir)?;
        write_meta(dir, meta)?;
        Ok(RunFiles {
            dir: dir.to_path_buf(),
            metrics: Mutex::new(Appender::create(&dir.join(METRICS))?),
            scrape: Mutex::new(Appender::lazy(&dir.join(SCRAPE))),
            warned: AtomicBool::new(false),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a request's row to `metrics.jsonl`.
    pub fn record(&self, row: &RequestRecord) {
        self.append(&self.metrics, row);
    }

    /// Appends a `/metrics` sample to `scrape.jsonl`.
    pub fn scrape(&self, row: &ScrapeRow) {
        self.append(&self.scrape, row);
    }

    /// A row that cannot be written does not stop the run: the driver
    /// keeps every row in memory too and the end of the run writes them
    /// all. Said once on stderr.
    fn append<T: serde::Serialize>(&self, file: &Mutex<Appender>, row: &T) {
        let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.append(row) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                eprintln!("kvc-replay: warning: rows are no longer written as they come ({e}); they are kept for the end of the run");
            }
        }
    }
}

/// `run.json`, replaced atomically.
pub fn write_meta(dir: &Path, meta: &RunMeta) -> Result<()> {
    write_atomic(&dir.join(RUN_JSON), &serde_json::to_vec_pretty(meta)?)
}

/// The run description for a report rebuilt from `rows`: `run.json`'s,
/// else `summary.json`'s `meta`, else [`inferred_meta`] (`runs`: how many
/// run directories the result has). The wall time is measured from the
/// rows again (what the run itself does), and a run with fewer rows than
/// it planned is marked interrupted: it was stopped before its workload
/// ended, by a kill if it could not say so.
pub fn load_meta(dir: &Path, rows: &[RequestRecord], scrapes: &[ScrapeRow], runs: usize) -> RunMeta {
    let from_run_json = || -> Option<RunMeta> { read_json(&dir.join(RUN_JSON), serde_json::from_value) };
    let from_summary = || -> Option<RunMeta> {
        read_json(&dir.join(SUMMARY_JSON), |mut v| {
            serde_json::from_value(v.get_mut("meta").map(serde_json::Value::take).unwrap_or_default())
        })
    };
    let Some(mut meta) = from_run_json().or_else(from_summary) else {
        return inferred_meta(rows, scrapes, runs);
    };
    meta.wall_s = span_s(rows);
    if rows.len() < meta.requests_planned {
        meta.interrupted = true;
    }
    meta
}

/// `path`'s JSON turned into a `T` by `f`; `None` when the file is absent,
/// or (with a warning) unreadable.
fn read_json<T>(path: &Path, f: impl FnOnce(serde_json::Value) -> serde_json::Result<T>) -> Option<T> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text).and_then(f) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("kvc-replay: warning: {}: no run description in it ({e}); looking further", path.display());
            None
        }
    }
}

/// A run description from the rows alone, for a directory with neither
/// `run.json` nor `summary.json`: what the rows say (run number, wall
/// time, requests, the scrape interval), `inferred: true`, and for the rest
/// "unknown" or the tool's defaults (marked unknown in the report).
pub fn inferred_meta(rows: &[RequestRecord], scrapes: &[ScrapeRow], runs: usize) -> RunMeta {
    let gaps: Vec<f64> = scrapes.windows(2).map(|w| w[1].t_s - w[0].t_s).collect();
    RunMeta {
        tool: format!("unknown (description inferred from the rows by kvc-replay {})", env!("CARGO_PKG_VERSION")),
        workload: "unknown".into(),
        endpoint: "unknown".into(),
        api: Api::Completions,
        model: None,
        time_scale: 1.0,
        pacing: Pacing::Think,
        concurrency: 0,
        request_timeout_s: 0.0,
        run: rows.first().map_or(1, |r| r.run),
        runs: runs.max(1),
        salt: 0,
        started_unix_s: 0.0,
        wall_s: span_s(rows),
        interrupted: false,
        stop_reason: None,
        scrape_interval_s: median(&gaps),
        reuse_block_tokens: 16,
        requests_planned: rows.len(),
        inferred: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Outcome;
    use crate::metrics::Sent;
    use crate::stop::StopReason;
    use std::collections::BTreeMap;

    fn row(run: usize, start_s: f64, latency_s: f64) -> RequestRecord {
        let sent = Sent {
            run,
            session: Some("s".into()),
            turn: 0,
            scheduled_s: start_s,
            start_s,
            prompt_tokens_sent: 10,
            reusable_tokens: 0,
            expected_output_tokens: 2,
        };
        RequestRecord::new(sent, &Outcome { latency_s, finish_reason: Some("length".into()), ..Default::default() })
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvc-replay-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_meta_inferred_from_rows_takes_what_they_say_and_marks_the_rest_unknown() {
        let rows = [row(2, 1.0, 0.5), row(2, 3.0, 1.5), row(2, 2.0, 0.25)];
        let scrapes: Vec<ScrapeRow> = [0.0, 1.0, 2.5].map(|t_s| ScrapeRow { t_s, values: BTreeMap::new() }).to_vec();
        let m = inferred_meta(&rows, &scrapes, 3);
        assert!(m.inferred && !m.interrupted && m.stop_reason.is_none());
        assert_eq!((m.workload.as_str(), m.endpoint.as_str(), m.run, m.runs, m.requests_planned), ("unknown", "unknown", 2, 3, 3));
        assert_eq!(m.wall_s, 3.5, "first send (1.0) to last answer (3.0 + 1.5)");
        assert_eq!((m.started_unix_s, m.scrape_interval_s), (0.0, Some(1.25)));
        let empty = inferred_meta(&[], &[], 0);
        assert_eq!((empty.run, empty.runs, empty.wall_s, empty.requests_planned, empty.scrape_interval_s), (1, 1, 0.0, 0, None));
    }

    #[test]
    fn the_description_comes_from_run_json_then_summary_json_then_the_rows() {
        let dir = scratch("run-dir-meta");
        let rows = [row(1, 0.0, 1.0), row(1, 1.0, 1.0)];
        let mut meta = inferred_meta(&rows, &[], 1);
        (meta.workload, meta.inferred, meta.requests_planned) = ("w".into(), false, 5);

        // Nothing but rows: inferred.
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load_meta(&dir, &rows, &[], 1).inferred);

        // A summary.json's meta (an older result directory).
        let mut from_summary = meta.clone();
        from_summary.workload = "from summary".into();
        let summary = serde_json::json!({"meta": from_summary, "requests": 2});
        std::fs::write(dir.join(SUMMARY_JSON), summary.to_string()).unwrap();
        assert_eq!(load_meta(&dir, &rows, &[], 1).workload, "from summary");

        // run.json, as written at the start of a run later killed: its
        // wall time comes from the rows, and 2 rows of 5 planned is an
        // interrupted run.
        let files = RunFiles::create(&dir, &meta).unwrap();
        assert!(!dir.join(SUMMARY_JSON).exists(), "a new run clears the old summary");
        assert_eq!(std::fs::read_to_string(dir.join(METRICS)).unwrap(), "", "metrics.jsonl exists before the first row");
        files.record(&rows[0]);
        let on_disk: Vec<RequestRecord> = crate::jsonl::read_jsonl(&dir.join(METRICS)).unwrap();
        assert_eq!(on_disk, rows[..1], "appended at once");
        let m = load_meta(files.dir(), &rows, &[], 1);
        assert_eq!((m.workload.as_str(), m.wall_s, m.interrupted, m.inferred), ("w", 2.0, true, false));
        assert!(!dir.join(SCRAPE).exists(), "no scrape.jsonl before the first sample");

        // A run that stopped and said why keeps its reason.
        meta.requests_planned = 2;
        (meta.interrupted, meta.stop_reason) = (true, Some(StopReason::Duration));
        write_meta(&dir, &meta).unwrap();
        let m = load_meta(&dir, &rows, &[], 1);
        assert_eq!((m.interrupted, m.stop_reason), (true, Some(StopReason::Duration)));
        meta.interrupted = false;
        write_meta(&dir, &meta).unwrap();
        assert!(!load_meta(&dir, &rows, &[], 1).interrupted, "every planned row is there");

        // An unreadable run.json falls back to the next source.
        std::fs::write(dir.join(RUN_JSON), "{\"tool\": ").unwrap();
        assert!(load_meta(&dir, &rows, &[], 1).inferred);
        std::fs::remove_dir_all(&dir).ok();
    }
}
