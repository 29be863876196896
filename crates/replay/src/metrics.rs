//! One row of `metrics.jsonl` per request, appended when the request ends
//! (see [`crate::run_dir`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::client::Outcome;
use crate::stats::Dist;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Itl {
    pub mean_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub max_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub run: usize,
    pub session: Option<String>,
    pub turn: usize,
    /// When the turn was due (trace time / time scale, or previous turn's
    /// end + think time), seconds from the run's start.
    pub scheduled_s: f64,
    /// When it was sent; later than `scheduled_s` when the concurrency
    /// cap held it back.
    pub start_s: f64,
    pub ttft_s: Option<f64>,
    /// (latency - TTFT) / (output tokens - 1).
    pub tpot_s: Option<f64>,
    /// Gaps between output chunks.
    pub itl: Option<Itl>,
    pub latency_s: f64,
    /// The server's count (usage), else the client's.
    pub prompt_tokens: u64,
    pub prompt_tokens_sent: u64,
    /// `usage.prompt_tokens_details.cached_tokens`, else the kvc field.
    pub cached_tokens: Option<u64>,
    pub computed_tokens: Option<u64>,
    /// Longest prefix an earlier request of this run already sent (whole blocks).
    pub reusable_tokens: u64,
    /// `usage.completion_tokens`, else the number of output chunks.
    pub output_tokens: Option<u64>,
    pub expected_output_tokens: u64,
    /// Finished without error (never true for a `cut` row).
    pub ok: bool,
    /// Cancelled in flight by a stop of the run (SIGINT, SIGTERM,
    /// `--duration-s`): neither ok nor an error of the server. Its times
    /// run to the stop. Absent in rows written before the field existed.
    #[serde(default)]
    pub cut: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// kvc's serving path (`kvc.path`, else the `x-kvc-path` header).
    pub path: Option<String>,
    pub reason: Option<String>,
    pub path_header: Option<String>,
    pub transferred_tokens: Option<u64>,
    pub finish_reason: Option<String>,
}

/// Where a request sits in the workload and how it was sent.
pub struct Sent {
    pub run: usize,
    pub session: Option<String>,
    pub turn: usize,
    pub scheduled_s: f64,
    pub start_s: f64,
    pub prompt_tokens_sent: u64,
    pub reusable_tokens: u64,
    pub expected_output_tokens: u64,
}

impl RequestRecord {
    pub fn new(sent: Sent, o: &Outcome) -> Self {
        let kvc = o.kvc.clone().unwrap_or_default();
        let output_tokens = o.completion_tokens.or_else(|| (!o.token_times_s.is_empty()).then_some(o.token_times_s.len() as u64));
        let prompt_tokens = o.prompt_tokens.unwrap_or(sent.prompt_tokens_sent);
        let cached_tokens = o.cached_tokens.or(kvc.cached_tokens);
        let computed_tokens = kvc.computed_tokens.or_else(|| cached_tokens.map(|c| prompt_tokens.saturating_sub(c)));
        let ok = o.error.is_none() && !o.cut;
        let tpot_s = match (ok, o.ttft_s, output_tokens) {
            (true, Some(t), Some(n)) if n >= 2 => Some((o.latency_s - t) / (n - 1) as f64),
            _ => None,
        };
        let gaps: Vec<f64> = o.token_times_s.windows(2).map(|w| w[1] - w[0]).collect();
        let itl = (!gaps.is_empty()).then(|| {
            let d = Dist::of(gaps);
            Itl { mean_s: d.mean.unwrap_or(0.0), p50_s: d.p50.unwrap_or(0.0), p90_s: d.p90.unwrap_or(0.0), max_s: d.max.unwrap_or(0.0) }
        });
        RequestRecord {
            run: sent.run,
            session: sent.session,
            turn: sent.turn,
            scheduled_s: sent.scheduled_s,
            start_s: sent.start_s,
            ttft_s: o.ttft_s,
            tpot_s,
            itl,
            latency_s: o.latency_s,
            prompt_tokens,
            prompt_tokens_sent: sent.prompt_tokens_sent,
            cached_tokens,
            computed_tokens,
            reusable_tokens: sent.reusable_tokens,
            output_tokens,
            expected_output_tokens: sent.expected_output_tokens,
            ok,
            cut: o.cut,
            status: o.status,
            error: o.error.clone(),
            path: kvc.path.or_else(|| o.path_header.clone()),
            reason: kvc.reason,
            path_header: o.path_header.clone(),
            transferred_tokens: kvc.transferred_tokens,
            finish_reason: o.finish_reason.clone(),
        }
    }

    /// `path/reason`, the path alone, `unlabelled` (a server without kvc's
    /// extensions), `cut` (by a stop of the run), or `error`.
    pub fn label(&self) -> String {
        if self.cut {
            return "cut".into();
        }
        if !self.ok {
            return "error".into();
        }
        match (&self.path, &self.reason) {
            (Some(p), Some(r)) => format!("{p}/{r}"),
            (Some(p), None) => p.clone(),
            (None, _) => "unlabelled".into(),
        }
    }
}

/// `rows` by [`RequestRecord::label`], each label's in their order.
pub fn by_label(rows: &[RequestRecord]) -> BTreeMap<String, Vec<&RequestRecord>> {
    let mut m: BTreeMap<String, Vec<&RequestRecord>> = BTreeMap::new();
    for r in rows {
        m.entry(r.label()).or_default().push(r);
    }
    m
}

/// First send to last answer (or cut) over `rows`, in seconds: a run's
/// wall time.
pub fn span_s(rows: &[RequestRecord]) -> f64 {
    let first = rows.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let last = rows.iter().map(|r| r.start_s + r.latency_s).fold(0.0, f64::max);
    if rows.is_empty() {
        0.0
    } else {
        (last - first).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::KvcInfo;

    fn sent() -> Sent {
        Sent {
            run: 1,
            session: Some("s".into()),
            turn: 2,
            scheduled_s: 1.0,
            start_s: 1.5,
            prompt_tokens_sent: 100,
            reusable_tokens: 64,
            expected_output_tokens: 4,
        }
    }

    #[test]
    fn rows_prefer_the_servers_counts_and_derive_tpot_and_itl() {
        let o = Outcome {
            status: Some(200),
            ttft_s: Some(0.5),
            token_times_s: vec![0.5, 0.6, 0.8, 0.9],
            latency_s: 0.9,
            prompt_tokens: Some(101),
            completion_tokens: Some(4),
            cached_tokens: Some(64),
            kvc: Some(KvcInfo {
                path: Some("local".into()),
                reason: Some("prefix_hit".into()),
                computed_tokens: Some(37),
                ..Default::default()
            }),
            path_header: Some("local".into()),
            finish_reason: Some("length".into()),
            ..Default::default()
        };
        let r = RequestRecord::new(sent(), &o);
        assert_eq!((r.prompt_tokens, r.cached_tokens, r.computed_tokens), (101, Some(64), Some(37)));
        assert!((r.tpot_s.unwrap() - 0.4 / 3.0).abs() < 1e-9);
        let itl = r.itl.clone().unwrap();
        assert!((itl.max_s - 0.2).abs() < 1e-9);
        assert_eq!(r.label(), "local/prefix_hit");
    }

    #[test]
    fn a_server_without_extensions_or_usage_still_gives_a_row() {
        let o = Outcome {
            status: Some(200),
            ttft_s: Some(0.1),
            token_times_s: vec![0.1, 0.2],
            latency_s: 0.2,
            finish_reason: Some("stop".into()),
            ..Default::default()
        };
        let r = RequestRecord::new(sent(), &o);
        assert_eq!((r.prompt_tokens, r.output_tokens, r.cached_tokens), (100, Some(2), None));
        assert_eq!(r.label(), "unlabelled");
        let failed = RequestRecord::new(sent(), &Outcome { error: Some("HTTP 500: x".into()), ..Default::default() });
        assert_eq!((failed.ok, failed.label().as_str()), (false, "error"));
        let cut = RequestRecord::new(sent(), &Outcome { ttft_s: Some(0.1), token_times_s: vec![0.1], latency_s: 2.0, cut: true, ..o });
        assert_eq!((cut.ok, cut.cut, cut.label().as_str(), cut.tpot_s), (false, true, "cut", None));
        assert_eq!(cut.ttft_s, Some(0.1), "what arrived before the stop is kept");
    }

    #[test]
    fn rows_written_before_the_cut_field_still_load() {
        let mut v = serde_json::to_value(RequestRecord::new(sent(), &Outcome::default())).unwrap();
        v.as_object_mut().unwrap().remove("cut");
        let r: RequestRecord = serde_json::from_value(v).unwrap();
        assert!(!r.cut && r.ok);
    }
}
