//! A run's report: `summary.json`, `summary.md` and the SVG plots, written
//! at the end of a run (also one cut short by a stop) or rebuilt from the
//! rows that [`crate::run_dir`] keeps as the run goes.

use std::fmt::Write;
use std::path::Path;

use crate::error::{ReplayError, Result};
use crate::file::write_file;
use crate::jsonl::{read_jsonl, write_atomic, write_jsonl};
use crate::metrics::{by_label, RequestRecord};
use crate::run_dir::{self, LATENCY_PLOT, POOL_PLOT, TTFT_PLOT, TTFT_TIME_PLOT};
use crate::run_meta::meta_table;
use crate::scrape::{pool_series, ScrapeRow};
use crate::stats::Dist;
use crate::summary::Summary;
use crate::svg::{cdf, Chart, Series, Style};

/// Rebuilds a result directory's summaries and plots from its rows alone
/// (after a kvc-replay update, to redraw, or after a run that was killed
/// before it could write them): each run's `metrics.jsonl` and
/// `scrape.jsonl`, with the run description of its `run.json`, else its
/// `summary.json`, else one inferred from the rows ([`run_dir::load_meta`]).
/// A multi-run directory is rebuilt run by run, then aggregated.
pub fn rebuild(dir: &Path) -> Result<()> {
    let mut run_dirs: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| ReplayError::io(dir, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join(run_dir::METRICS).exists())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    if run_dirs.is_empty() {
        rebuild_run(dir, 1)?;
        return Ok(());
    }
    run_dirs.sort_by_key(|d| d.trim_start_matches("run-").parse::<usize>().unwrap_or(usize::MAX));
    let summaries: Vec<Summary> = run_dirs.iter().map(|d| rebuild_run(&dir.join(d), run_dirs.len())).collect::<Result<_>>()?;
    crate::runs::Aggregate::new(&summaries, run_dirs).write(dir)
}

fn rebuild_run(dir: &Path, runs: usize) -> Result<Summary> {
    let mut rows: Vec<RequestRecord> = read_jsonl(&dir.join(run_dir::METRICS))?;
    rows.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let scrape = dir.join(run_dir::SCRAPE);
    let scrapes: Vec<ScrapeRow> = if scrape.exists() { read_jsonl(&scrape)? } else { Vec::new() };
    let meta = run_dir::load_meta(dir, &rows, &scrapes, runs);
    let summary = Summary::new(meta, &rows, &scrapes);
    write_reports(dir, &summary, &rows, &scrapes)?;
    Ok(summary)
}

/// Writes everything about one finished (or stopped) run into `dir`
/// (created if missing): the rows again, in send order, the final
/// `run.json`, the summary and the plots.
pub fn write_run(dir: &Path, summary: &Summary, rows: &[RequestRecord], scrapes: &[ScrapeRow]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ReplayError::io(dir, e))?;
    write_jsonl(&dir.join(run_dir::METRICS), rows)?;
    if !scrapes.is_empty() {
        write_jsonl(&dir.join(run_dir::SCRAPE), scrapes)?;
    }
    run_dir::write_meta(dir, &summary.meta)?;
    write_reports(dir, summary, rows, scrapes)
}

/// `summary.json`, `summary.md` and the plots.
fn write_reports(dir: &Path, summary: &Summary, rows: &[RequestRecord], scrapes: &[ScrapeRow]) -> Result<()> {
    write_file(&dir.join(TTFT_PLOT), &ttft_chart(rows).render())?;
    write_file(&dir.join(LATENCY_PLOT), &latency_chart(rows).render())?;
    write_file(&dir.join(TTFT_TIME_PLOT), &ttft_over_time_chart(rows).render())?;
    let pool = pool_chart(scrapes);
    if !pool.series.is_empty() {
        write_file(&dir.join(POOL_PLOT), &pool.render())?;
    }
    write_file(&dir.join(run_dir::SUMMARY_MD), &markdown(summary, !pool.series.is_empty()))?;
    write_atomic(&dir.join(run_dir::SUMMARY_JSON), serde_json::to_string_pretty(summary)?.as_bytes())
}

pub fn ttft_chart(rows: &[RequestRecord]) -> Chart {
    let series = by_label(rows)
        .into_iter()
        .filter(|(l, _)| l != "error" && l != "cut")
        .map(|(l, rs)| {
            let pts = cdf(rs.iter().filter_map(|r| r.ttft_s).collect());
            Series { name: format!("{l} (n={})", pts.len()), points: pts, style: Style::Step }
        })
        .collect();
    Chart {
        title: "TTFT CDF by serving path".into(),
        x_label: "time to first token (s, log scale)".into(),
        y_label: "fraction of requests".into(),
        series,
        x_log: true,
        y_range: Some((0.0, 1.0)),
    }
}

pub fn latency_chart(rows: &[RequestRecord]) -> Chart {
    over_time(rows, "End-to-end latency over the run", "latency (s)", |r| Some(r.latency_s))
}

/// TTFT by send time: a queue that grows (or an engine that stalls) shows
/// as a rising trend.
pub fn ttft_over_time_chart(rows: &[RequestRecord]) -> Chart {
    over_time(rows, "Time to first token over the run", "TTFT (s)", |r| r.ttft_s)
}

/// One dot per request at its send time, `y` of it, by serving path.
fn over_time(rows: &[RequestRecord], title: &str, y_label: &str, y: impl Fn(&RequestRecord) -> Option<f64>) -> Chart {
    let series = by_label(rows)
        .into_iter()
        .map(|(l, rs)| {
            let points: Vec<(f64, f64)> = rs.iter().filter_map(|r| Some((r.start_s, y(r)?))).collect();
            Series { name: format!("{l} (n={})", points.len()), points, style: Style::Dots }
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    Chart {
        title: title.into(),
        x_label: "request sent at (s from run start)".into(),
        y_label: y_label.into(),
        series,
        ..Default::default()
    }
}

pub fn pool_chart(scrapes: &[ScrapeRow]) -> Chart {
    Chart {
        title: "KV pool usage (scraped from /metrics)".into(),
        x_label: "s from run start".into(),
        y_label: "fraction of pool".into(),
        series: pool_series(scrapes).into_iter().map(|(name, points)| Series { name, points, style: Style::Line }).collect(),
        x_log: false,
        y_range: Some((0.0, 1.0)),
    }
}

pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

fn dist_row(name: &str, d: &Dist) -> String {
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} |\n",
        d.n,
        fmt_opt(d.mean, 3),
        fmt_opt(d.p50, 3),
        fmt_opt(d.p90, 3),
        fmt_opt(d.p99, 3),
        fmt_opt(d.max, 3)
    )
}

pub fn markdown(s: &Summary, pool_plot: bool) -> String {
    let mut md = String::from("# kvc-replay report\n\n");
    md.push_str(&meta_table(&s.meta));
    let cut = match s.cut {
        0 => String::new(),
        n => format!(
            ", and {n} cut in flight by the stop (neither ok nor errors: the error rate is over the {} that finished)",
            s.requests - n
        ),
    };
    let _ = write!(
        md,
        "\n## Results\n\n{} requests: {} ok, **{} errors** (error rate {:.2} %){cut}.\n\
         Throughput: {:.2} requests/s, {:.1} output tokens/s, {:.0} prompt tokens/s.\n\n\
         | seconds | n | mean | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|---|\n",
        s.requests,
        s.ok,
        s.errors,
        s.error_rate * 100.0,
        s.requests_per_s,
        s.output_tokens_per_s,
        s.prompt_tokens_per_s
    );
    md.push_str(&dist_row("TTFT", &s.ttft_s));
    md.push_str(&dist_row("TPOT", &s.tpot_s));
    md.push_str(&dist_row("latency", &s.latency_s));
    md.push_str(&dist_row("schedule lag", &s.schedule_lag_s));
    md.push_str(
        "\nTTFT is measured to the first chunk carrying output; TPOT is (latency - TTFT) / (output tokens - 1); \
         schedule lag is how late requests left the client behind their schedule (the concurrency cap).\n",
    );

    md.push_str("\n## Reuse\n\n");
    match s.reuse_ratio {
        Some(r) => {
            let _ = writeln!(
                md,
                "- **reuse ratio {:.3}**: {} cached of {} prompt tokens, as the server reported them \
                 ({} of {} successful requests reported cached tokens).",
                r, s.cached_tokens, s.prompt_tokens, s.cache_reports, s.ok
            );
        }
        None => md.push_str("- reuse ratio: **unknown**, the server reported no cached tokens.\n"),
    }
    let _ = writeln!(
        md,
        "- reusable ratio {:.3}: prompt tokens, in whole {}-token blocks, that an earlier request of this run had \
         already sent (the client's own count; what a perfect cache could reuse).",
        s.reusable_ratio, s.meta.reuse_block_tokens
    );
    if let (Some(r), true) = (s.reuse_ratio, s.reusable_ratio > 0.0) {
        let _ = writeln!(md, "- the server reused {:.1} % of what was reusable.", 100.0 * r / s.reusable_ratio);
    }
    if s.sessions > 0 && s.meta.api == crate::client::Api::Completions && !s.meta.inferred {
        md.push_str(
            "- Session turns carry a synthesized stand-in for the previous answer (completions API): the server \
             can reuse the previous prompt but must recompute the stand-in, so session reuse is under-reported by \
             about one output length per turn (crate README).\n",
        );
    }

    md.push_str("\n## Path mix\n\n");
    if s.kvc_labelled == 0 {
        md.push_str("The server sent no `x-kvc-path` header or `kvc` field: requests are `unlabelled`.\n\n");
    }
    md.push_str("| path/reason | requests | share | TTFT p50 (s) | latency p50 (s) | cached/prompt |\n|---|---|---|---|---|---|\n");
    for (label, p) in &s.path_mix {
        let reuse = if p.prompt_tokens > 0 { format!("{:.3}", p.cached_tokens as f64 / p.prompt_tokens as f64) } else { "–".into() };
        let _ = writeln!(
            md,
            "| {label} | {} | {:.1} % | {} | {} | {reuse} |",
            p.count,
            p.share * 100.0,
            fmt_opt(p.ttft_p50_s, 3),
            fmt_opt(p.latency_p50_s, 3)
        );
    }
    if !s.top_errors.is_empty() {
        md.push_str("\n## Errors\n\n| count | message |\n|---|---|\n");
        for (msg, n) in &s.top_errors {
            let _ = writeln!(md, "| {n} | {} |", msg.replace('|', "\\|").replace('\n', " "));
        }
    }
    md.push_str("\n## Plots\n\n");
    let _ =
        writeln!(md, "![TTFT CDF by path]({TTFT_PLOT})\n\n![TTFT over time]({TTFT_TIME_PLOT})\n\n![Latency over time]({LATENCY_PLOT})\n");
    match (pool_plot, s.pool_peak_usage) {
        (true, peak) => {
            let _ = writeln!(md, "![KV pool usage]({POOL_PLOT})\n\nPeak device pool usage: {}.", fmt_opt(peak, 3));
        }
        (false, _) => md.push_str("No pool usage plot: /metrics was not scraped or exposes no pool gauges.\n"),
    }
    md
}
