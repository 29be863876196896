//! Scraping the server's Prometheus `/metrics` during a run: every gauge
//! and counter whose name starts with `kvc_` (or vLLM's `vllm:` / SGLang's
//! `sglang:`), as they are, so metrics the server adds later are recorded
//! without changes here. Histograms are left out (the client measures
//! latencies itself). kvc serves /metrics from a published snapshot, so
//! scraping does not disturb its scheduler.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::http::{self, BaseUrl};

pub const PREFIXES: &[&str] = &["kvc_", "vllm:", "sglang:"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScrapeRow {
    /// Seconds from the run's start.
    pub t_s: f64,
    /// `name{labels}` -> value.
    pub values: BTreeMap<String, f64>,
}

/// Gauge and counter samples of the exposition `text` under `prefixes`.
pub fn parse(text: &str, prefixes: &[&str]) -> BTreeMap<String, f64> {
    let mut kinds: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                kinds.insert(name, kind);
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        if !prefixes.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let family = ["_bucket", "_sum", "_count", "_created"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| kinds.contains_key(f)))
            .unwrap_or(name);
        let kind = kinds.get(family).copied();
        if matches!(kind, Some("histogram" | "summary")) || (kind.is_none() && name.ends_with("_bucket")) {
            continue;
        }
        // `name{labels} value [timestamp]`; labels may contain spaces.
        let after_labels = match line[name_end..].starts_with('{') {
            true => line[name_end..].find('}').map(|i| name_end + i + 1).unwrap_or(line.len()),
            false => name_end,
        };
        let key = &line[..after_labels];
        if let Some(v) = line[after_labels..].split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            out.insert(key.to_string(), v);
        }
    }
    out
}

/// Scrapes `url`/metrics every `interval` until `stop` turns true, each
/// sample handed to `on_row` as it is taken (the driver appends it to the
/// run's `scrape.jsonl`). Gives up after three failures in a row before any
/// success (a server without /metrics).
pub async fn scrape_loop(
    url: BaseUrl,
    interval: Duration,
    t0: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
    on_row: impl Fn(&ScrapeRow),
) -> Vec<ScrapeRow> {
    let mut rows = Vec::new();
    let mut failures = 0;
    loop {
        let t_s = t0.elapsed().as_secs_f64();
        let scrape = tokio::time::timeout(interval.max(Duration::from_secs(2)), http::get(&url, "/metrics", &[]));
        let got = tokio::select! {
            got = scrape => got,
            _ = stop.wait_for(|s| *s) => return rows,
        };
        match got {
            Ok(Ok((200, body))) => {
                failures = 0;
                let row = ScrapeRow { t_s, values: parse(&String::from_utf8_lossy(&body), PREFIXES) };
                on_row(&row);
                rows.push(row);
            }
            _ => {
                failures += 1;
                if rows.is_empty() && failures >= 3 {
                    return rows;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return rows,
        }
    }
}

/// The KV pool's fill over time, as fractions of its size: kvc's block
/// gauges, or vLLM's / SGLang's usage gauges.
pub fn pool_series(rows: &[ScrapeRow]) -> Vec<(String, Vec<(f64, f64)>)> {
    let find = |r: &ScrapeRow, name: &str| -> Option<f64> {
        r.values.iter().find(|(k, _)| *k == name || k.starts_with(&format!("{name}{{"))).map(|(_, v)| *v)
    };
    let mut series = Vec::new();
    let mut ratio = |label: &str, num: &str, den: &str, invert: bool| {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                let (n, d) = (find(r, num)?, find(r, den)?);
                (d > 0.0).then(|| (r.t_s, if invert { 1.0 - n / d } else { n / d }))
            })
            .collect();
        if !pts.is_empty() {
            series.push((label.to_string(), pts));
        }
    };
    ratio("device KV blocks not free (requests + caches)", "kvc_kv_blocks_free", "kvc_kv_blocks_total", true);
    ratio("device KV blocks held only by caches (evictable)", "kvc_kv_blocks_evictable", "kvc_kv_blocks_total", false);
    ratio("host KV blocks in use", "kvc_host_kv_blocks_free", "kvc_host_kv_blocks_total", true);
    for (label, name) in [
        ("vLLM KV cache usage", "vllm:kv_cache_usage_perc"),
        ("vLLM KV cache usage", "vllm:gpu_cache_usage_perc"),
        ("SGLang token usage", "sglang:token_usage"),
    ] {
        let pts: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r.t_s, find(r, name)?))).collect();
        if !pts.is_empty() && !series.iter().any(|(l, _)| l == label) {
            series.push((label.to_string(), pts));
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP kvc_kv_blocks_free x\n# TYPE kvc_kv_blocks_free gauge\nkvc_kv_blocks_free 7\n\
        # TYPE kvc_kv_blocks_total gauge\nkvc_kv_blocks_total 10\n\
        # TYPE kvc_served_requests_total counter\nkvc_served_requests_total{path=\"local\",reason=\"a b\"} 3\n\
        # TYPE kvc_ttft_seconds histogram\nkvc_ttft_seconds_bucket{le=\"0.1\"} 1\nkvc_ttft_seconds_sum 0.5\nkvc_ttft_seconds_count 2\n\
        other_metric 5\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";

    #[test]
    fn gauges_and_counters_are_kept_and_histograms_dropped() {
        let v = parse(TEXT, PREFIXES);
        assert_eq!(v.get("kvc_kv_blocks_free"), Some(&7.0));
        assert_eq!(v.get("kvc_served_requests_total{path=\"local\",reason=\"a b\"}"), Some(&3.0));
        assert_eq!(v.get("vllm:kv_cache_usage_perc{model_name=\"m\"}"), Some(&0.25));
        assert!(!v.keys().any(|k| k.starts_with("kvc_ttft") || k.starts_with("other")), "{v:?}");
    }

    #[test]
    fn pool_usage_comes_from_kvc_blocks_or_vllm_gauges() {
        let rows = vec![ScrapeRow { t_s: 1.0, values: parse(TEXT, PREFIXES) }];
        let s = pool_series(&rows);
        assert!(s[0].0.starts_with("device KV blocks not free"));
        assert!((s[0].1[0].1 - 0.3).abs() < 1e-9);
        assert!(s.iter().any(|(l, p)| l == "vLLM KV cache usage" && p[0].1 == 0.25));
    }
}
