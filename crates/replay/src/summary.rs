//! `summary.json`: one run's numbers, from its rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::{by_label, RequestRecord};
use crate::run_meta::RunMeta;
use crate::scrape::{pool_series, ScrapeRow};
use crate::stats::Dist;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathStats {
    pub count: usize,
    pub share: f64,
    pub ttft_p50_s: Option<f64>,
    pub latency_p50_s: Option<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub meta: RunMeta,
    pub requests: usize,
    /// Distinct session ids (0 for independent requests such as Mooncake's).
    #[serde(default)]
    pub sessions: usize,
    pub ok: usize,
    /// Requests that failed (the server's error, a timeout), not counting
    /// `cut` ones.
    pub errors: usize,
    /// Requests cut in flight by a stop of the run (SIGINT, SIGTERM,
    /// `--duration-s`); `requests = ok + errors + cut`.
    #[serde(default)]
    pub cut: usize,
    /// errors / (requests - cut).
    pub error_rate: f64,
    /// Over successful requests.
    pub ttft_s: Dist,
    pub tpot_s: Dist,
    pub latency_s: Dist,
    /// How late requests went out against their schedule (client-side
    /// queueing behind `--concurrency`); large values mean the offered
    /// load was not the trace's.
    pub schedule_lag_s: Dist,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    /// Successful requests whose cached-token count the server reported.
    pub cache_reports: usize,
    pub cached_tokens: u64,
    /// cached / prompt tokens over requests with a report; `None` when
    /// the server reported none (not zero: unknown).
    pub reuse_ratio: Option<f64>,
    /// The client's own count of reusable prompt tokens / prompt tokens
    /// sent (what a perfect cache could have reused).
    pub reusable_tokens: u64,
    pub reusable_ratio: f64,
    /// Successful requests that carried a kvc path (body or header).
    pub kvc_labelled: usize,
    /// By `path/reason` label (see [`RequestRecord::label`]).
    pub path_mix: BTreeMap<String, PathStats>,
    pub top_errors: Vec<(String, usize)>,
    /// Largest fraction of the device KV pool in use while scraping.
    pub pool_peak_usage: Option<f64>,
}

impl Summary {
    pub fn new(meta: RunMeta, rows: &[RequestRecord], scrapes: &[ScrapeRow]) -> Summary {
        let ok: Vec<&RequestRecord> = rows.iter().filter(|r| r.ok).collect();
        let cut = rows.iter().filter(|r| r.cut).count();
        let errors = rows.len() - ok.len() - cut;
        let finished = rows.len() - cut;
        let wall = meta.wall_s.max(1e-9);
        let reported: Vec<&&RequestRecord> = ok.iter().filter(|r| r.cached_tokens.is_some()).collect();
        let cached: u64 = reported.iter().filter_map(|r| r.cached_tokens).sum();
        let reported_prompt: u64 = reported.iter().map(|r| r.prompt_tokens).sum();
        let sent: u64 = rows.iter().map(|r| r.prompt_tokens_sent).sum();
        let reusable: u64 = rows.iter().map(|r| r.reusable_tokens).sum();

        let path_mix = by_label(rows)
            .into_iter()
            .map(|(label, rs)| {
                let stats = PathStats {
                    count: rs.len(),
                    share: rs.len() as f64 / rows.len().max(1) as f64,
                    ttft_p50_s: Dist::of(rs.iter().filter_map(|r| r.ttft_s).collect()).p50,
                    latency_p50_s: Dist::of(rs.iter().filter(|r| r.ok).map(|r| r.latency_s).collect()).p50,
                    prompt_tokens: rs.iter().map(|r| r.prompt_tokens).sum(),
                    cached_tokens: rs.iter().filter_map(|r| r.cached_tokens).sum(),
                };
                (label, stats)
            })
            .collect();

        let mut errs: BTreeMap<String, usize> = BTreeMap::new();
        for r in rows.iter().filter(|r| !r.ok && !r.cut) {
            let msg: String = r.error.clone().unwrap_or_default().chars().take(160).collect();
            *errs.entry(msg).or_default() += 1;
        }
        let mut top_errors: Vec<(String, usize)> = errs.into_iter().collect();
        top_errors.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        top_errors.truncate(10);

        let pool_peak_usage = pool_series(scrapes)
            .into_iter()
            .find(|(l, _)| !l.contains("evictable") && !l.contains("host"))
            .map(|(_, pts)| pts.iter().map(|p| p.1).fold(0.0, f64::max));

        let sessions: std::collections::BTreeSet<&str> = rows.iter().filter_map(|r| r.session.as_deref()).collect();
        Summary {
            requests: rows.len(),
            sessions: sessions.len(),
            ok: ok.len(),
            errors,
            cut,
            error_rate: if finished == 0 { 0.0 } else { errors as f64 / finished as f64 },
            ttft_s: Dist::of(ok.iter().filter_map(|r| r.ttft_s).collect()),
            tpot_s: Dist::of(ok.iter().filter_map(|r| r.tpot_s).collect()),
            latency_s: Dist::of(ok.iter().map(|r| r.latency_s).collect()),
            schedule_lag_s: Dist::of(rows.iter().map(|r| (r.start_s - r.scheduled_s).max(0.0)).collect()),
            requests_per_s: ok.len() as f64 / wall,
            output_tokens_per_s: ok.iter().filter_map(|r| r.output_tokens).sum::<u64>() as f64 / wall,
            prompt_tokens_per_s: ok.iter().map(|r| r.prompt_tokens).sum::<u64>() as f64 / wall,
            prompt_tokens: ok.iter().map(|r| r.prompt_tokens).sum(),
            output_tokens: ok.iter().filter_map(|r| r.output_tokens).sum(),
            cache_reports: reported.len(),
            cached_tokens: cached,
            reuse_ratio: (!reported.is_empty() && reported_prompt > 0).then(|| cached as f64 / reported_prompt as f64),
            reusable_tokens: reusable,
            reusable_ratio: if sent == 0 { 0.0 } else { reusable as f64 / sent as f64 },
            kvc_labelled: ok.iter().filter(|r| r.path.is_some()).count(),
            path_mix,
            top_errors,
            pool_peak_usage,
            meta,
        }
    }

    /// The numbers compared across runs and directories, by stable name.
    pub fn headline(&self) -> BTreeMap<String, f64> {
        let mut h = BTreeMap::new();
        let mut put = |k: &str, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                h.insert(k.to_string(), v);
            }
        };
        put("requests", Some(self.requests as f64));
        put("errors", Some(self.errors as f64));
        put("error_rate", Some(self.error_rate));
        put("cut", Some(self.cut as f64));
        for (name, d) in [("ttft", &self.ttft_s), ("tpot", &self.tpot_s), ("latency", &self.latency_s)] {
            put(&format!("{name}_mean_s"), d.mean);
            put(&format!("{name}_p50_s"), d.p50);
            put(&format!("{name}_p90_s"), d.p90);
            put(&format!("{name}_p99_s"), d.p99);
        }
        put("requests_per_s", Some(self.requests_per_s));
        put("output_tokens_per_s", Some(self.output_tokens_per_s));
        put("reuse_ratio", self.reuse_ratio);
        put("reusable_ratio", Some(self.reusable_ratio));
        put("schedule_lag_p99_s", self.schedule_lag_s.p99);
        put("pool_peak_usage", self.pool_peak_usage);
        h
    }
}

/// A headline value for a table: counts without decimals.
pub fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e12 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// Headline names in display order, with how to show them.
pub const HEADLINE_ORDER: &[(&str, &str)] = &[
    ("requests", "requests"),
    ("errors", "errors"),
    ("error_rate", "error rate"),
    ("cut", "cut by a stop"),
    ("ttft_mean_s", "TTFT mean (s)"),
    ("ttft_p50_s", "TTFT p50 (s)"),
    ("ttft_p90_s", "TTFT p90 (s)"),
    ("ttft_p99_s", "TTFT p99 (s)"),
    ("tpot_mean_s", "TPOT mean (s)"),
    ("tpot_p50_s", "TPOT p50 (s)"),
    ("tpot_p90_s", "TPOT p90 (s)"),
    ("tpot_p99_s", "TPOT p99 (s)"),
    ("latency_mean_s", "latency mean (s)"),
    ("latency_p50_s", "latency p50 (s)"),
    ("latency_p90_s", "latency p90 (s)"),
    ("latency_p99_s", "latency p99 (s)"),
    ("requests_per_s", "requests/s"),
    ("output_tokens_per_s", "output tokens/s"),
    ("reuse_ratio", "reuse ratio (cached/prompt)"),
    ("reusable_ratio", "reusable ratio (client count)"),
    ("schedule_lag_p99_s", "schedule lag p99 (s)"),
    ("pool_peak_usage", "KV pool peak usage"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Api, Outcome};
    use crate::metrics::Sent;
    use crate::pacing::Pacing;

    pub(crate) fn meta() -> RunMeta {
        RunMeta {
            tool: "kvc-replay".into(),
            workload: "w".into(),
            endpoint: "http://x".into(),
            api: Api::Completions,
            model: None,
            time_scale: 1.0,
            pacing: Pacing::Think,
            concurrency: 4,
            request_timeout_s: 60.0,
            run: 1,
            runs: 1,
            salt: 0,
            started_unix_s: 0.0,
            wall_s: 10.0,
            interrupted: false,
            stop_reason: None,
            scrape_interval_s: None,
            reuse_block_tokens: 16,
            requests_planned: 3,
            inferred: false,
        }
    }

    fn row(cached: Option<u64>, error: Option<&str>, reason: &str) -> RequestRecord {
        let sent = Sent {
            run: 1,
            session: None,
            turn: 0,
            scheduled_s: 0.0,
            start_s: 0.5,
            prompt_tokens_sent: 100,
            reusable_tokens: 50,
            expected_output_tokens: 2,
        };
        let o = Outcome {
            status: Some(200),
            ttft_s: Some(0.1),
            token_times_s: vec![0.1, 0.2],
            latency_s: 0.3,
            prompt_tokens: Some(100),
            completion_tokens: Some(2),
            cached_tokens: cached,
            error: error.map(str::to_string),
            finish_reason: Some("length".into()),
            kvc: Some(crate::client::KvcInfo { path: Some("local".into()), reason: Some(reason.into()), ..Default::default() }),
            ..Default::default()
        };
        RequestRecord::new(sent, &o)
    }

    #[test]
    fn reuse_is_cached_over_prompt_and_errors_are_counted_not_averaged() {
        let rows = vec![row(Some(0), None, "cold"), row(Some(80), None, "prefix_hit"), row(None, Some("HTTP 500: boom"), "x")];
        let s = Summary::new(meta(), &rows, &[]);
        assert_eq!((s.requests, s.ok, s.errors), (3, 2, 1));
        assert!((s.error_rate - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.reuse_ratio, Some(0.4));
        assert!((s.reusable_ratio - 0.5).abs() < 1e-12);
        assert_eq!(s.path_mix["local/prefix_hit"].count, 1);
        assert_eq!(s.path_mix["error"].count, 1);
        assert_eq!(s.top_errors, vec![("HTTP 500: boom".to_string(), 1)]);
        assert_eq!(s.latency_s.n, 2);
        assert_eq!(s.headline()["reuse_ratio"], 0.4);
    }

    #[test]
    fn cut_rows_are_counted_apart_from_errors_and_out_of_the_error_rate() {
        let mut cut = row(None, None, "x");
        (cut.ok, cut.cut) = (false, true);
        let rows = vec![row(Some(0), None, "cold"), row(None, Some("HTTP 500: boom"), "x"), cut.clone(), cut];
        let s = Summary::new(meta(), &rows, &[]);
        assert_eq!((s.requests, s.ok, s.errors, s.cut), (4, 1, 1, 2));
        assert!((s.error_rate - 0.5).abs() < 1e-12, "1 error of the 2 that finished");
        assert_eq!(s.top_errors, vec![("HTTP 500: boom".to_string(), 1)]);
        assert_eq!((s.path_mix["cut"].count, s.path_mix["error"].count), (2, 1));
        assert_eq!((s.latency_s.n, s.headline()["cut"]), (1, 2.0));
    }

    #[test]
    fn summaries_written_before_cut_and_stop_reason_existed_still_load() {
        let s = Summary::new(meta(), &[row(Some(0), None, "cold")], &[]);
        let mut v = serde_json::to_value(&s).unwrap();
        assert!(v["meta"].get("stop_reason").is_none() && v["meta"].get("inferred").is_none(), "left out when unset");
        v.as_object_mut().unwrap().remove("cut");
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_server_that_reports_no_cache_gives_unknown_reuse_not_zero() {
        let s = Summary::new(meta(), &[row(None, None, "cold")], &[]);
        assert_eq!(s.reuse_ratio, None);
        assert!(!s.headline().contains_key("reuse_ratio"));
    }
}
