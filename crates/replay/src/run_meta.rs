//! How a run was made ([`RunMeta`], `run.json`) and the table that
//! describes it at the top of every report.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::client::Api;
use crate::pacing::Pacing;
use crate::stop::StopReason;

/// How a run was made; printed at the top of every report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub tool: String,
    pub workload: String,
    pub endpoint: String,
    pub api: Api,
    pub model: Option<String>,
    /// 1 = real time; N = the trace's times divided by N.
    pub time_scale: f64,
    pub pacing: Pacing,
    pub concurrency: usize,
    pub request_timeout_s: f64,
    pub run: usize,
    pub runs: usize,
    pub salt: u64,
    /// 0 when unknown (a description inferred from the rows).
    pub started_unix_s: f64,
    pub wall_s: f64,
    /// Stopped before the workload ended: see `stop_reason`. Also set when
    /// a report is rebuilt from fewer rows than `requests_planned` (a run
    /// killed without a chance to say why).
    pub interrupted: bool,
    /// Why an interrupted run stopped, when it could say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    pub scrape_interval_s: Option<f64>,
    pub reuse_block_tokens: usize,
    pub requests_planned: usize,
    /// No run description was found (`run.json`, `summary.json`): this one
    /// is inferred from the rows, and what they do not say is unknown
    /// (see [`crate::run_dir::inferred_meta`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inferred: bool,
}

/// The time-scale line every report carries.
pub fn time_scale_text(ts: f64) -> String {
    if ts == 1.0 {
        "1 (real time)".into()
    } else {
        format!(
            "**{ts}** ({ts}x faster than the trace: arrivals and think times divided by {ts}; sessions are busier \
             than in reality, and their KV has less time to go cold)"
        )
    }
}

pub fn meta_table(m: &RunMeta) -> String {
    let mut s = String::from("| | |\n|---|---|\n");
    if m.inferred {
        s.push_str(
            "| run description | **unknown**: the directory has no `run.json` or `summary.json`, so workload, endpoint, \
             time scale, pacing and limits are not known; what follows is read from the rows |\n",
        );
    } else {
        let _ = writeln!(s, "| workload | {} ({} requests planned) |", m.workload, m.requests_planned);
        let _ = writeln!(
            s,
            "| endpoint | {} ({} api), model {} |",
            m.endpoint,
            format!("{:?}", m.api).to_lowercase(),
            m.model.as_deref().unwrap_or("(not sent)")
        );
        let _ = writeln!(s, "| time scale | {} |", time_scale_text(m.time_scale));
        let pacing = match m.pacing {
            Pacing::Think => "think (a session's next turn starts its think time after the previous one ends)",
            Pacing::Arrival => "arrival (a session's next turn starts at its trace time, or when the previous one ends if later)",
        };
        let _ = writeln!(s, "| pacing | {pacing} |");
        let _ = writeln!(s, "| concurrency cap | {} |", m.concurrency);
        let _ = writeln!(s, "| request timeout | {} s |", m.request_timeout_s);
    }
    match (m.run, m.inferred) {
        (0, _) => {
            let _ = writeln!(s, "| runs | {} (each with its own token salt and session ids) |", m.runs);
        }
        (run, true) => {
            let _ = writeln!(s, "| run | {run} of {} |", m.runs);
        }
        (run, false) => {
            let _ = writeln!(s, "| run | {run} of {} (token salt {}) |", m.runs, m.salt);
        }
    }
    let started = if m.started_unix_s > 0.0 { utc(m.started_unix_s) } else { "unknown".into() };
    let _ = writeln!(s, "| started | {started} |");
    let stopped = match (m.interrupted, m.stop_reason) {
        (false, _) => "",
        (true, Some(StopReason::Signal)) => " (**interrupted** by a signal: requests in flight were cut)",
        (true, Some(StopReason::Duration)) => " (**stopped** at `--duration-s`: requests in flight were cut)",
        (true, None) => " (**interrupted**)",
    };
    let _ = writeln!(s, "| wall time | {:.1} s{stopped} |", m.wall_s);
    let scrape = match (m.scrape_interval_s, m.inferred) {
        (Some(s), true) => format!("about every {s:.1} s"),
        (Some(s), false) => format!("every {s} s"),
        (None, _) => "off".to_string(),
    };
    let _ = writeln!(s, "| /metrics scraping | {scrape} |");
    let _ = writeln!(s, "| tool | {} |", m.tool);
    s
}

/// `2026-05-06 12:00:00 UTC` from unix seconds.
pub fn utc(unix_s: f64) -> String {
    let secs = unix_s.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_civil() {
        assert_eq!(utc(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_709_251_199.0), "2024-02-29 23:59:59 UTC");
    }

    #[test]
    fn every_report_states_its_time_scale() {
        assert!(time_scale_text(1.0).contains("real time"));
        let t = time_scale_text(10.0);
        assert!(t.contains("10x faster") && t.contains("busier than in reality"), "{t}");
    }
}
