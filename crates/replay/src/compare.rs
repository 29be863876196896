//! `kvc-replay compare DIR...`: the headline numbers of several result
//! directories side by side (a multi-run directory shows median [min-max]).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use crate::error::{ReplayError, Result};
use crate::run_meta::RunMeta;
use crate::runs::Aggregate;
use crate::summary::{fmt_value, Summary, HEADLINE_ORDER};

/// A result directory's `summary.json`: one run or several.
pub enum Loaded {
    Run(Box<Summary>),
    Runs(Box<Aggregate>),
}

impl Loaded {
    pub fn meta(&self) -> &RunMeta {
        match self {
            Loaded::Run(s) => &s.meta,
            Loaded::Runs(a) => &a.meta,
        }
    }

    fn runs(&self) -> usize {
        match self {
            Loaded::Run(_) => 1,
            Loaded::Runs(a) => a.runs,
        }
    }

    fn cell(&self, key: &str) -> String {
        match self {
            Loaded::Run(s) => s.headline().get(key).map_or("–".into(), |v| fmt_value(*v)),
            Loaded::Runs(a) => {
                a.metrics.get(key).map_or("–".into(), |s| format!("{} [{}–{}]", fmt_value(s.median), fmt_value(s.min), fmt_value(s.max)))
            }
        }
    }
}

/// Requests per path label (`path/reason`, or `error` / `unlabelled`),
/// summed over a directory's runs (a multi-run directory's per-run
/// summaries are read from its run directories).
fn path_counts(dir: &Path, loaded: &Loaded) -> Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    let mut add = |s: &Summary| {
        for (label, p) in &s.path_mix {
            *counts.entry(label.clone()).or_insert(0) += p.count;
        }
    };
    match loaded {
        Loaded::Run(s) => add(s),
        Loaded::Runs(a) => {
            for run in &a.run_dirs {
                if let Loaded::Run(s) = load(&dir.join(run))? {
                    add(&s);
                }
            }
        }
    }
    Ok(counts)
}

/// `label count (share %)`, most frequent first, separated by `<br>`.
fn path_cell(counts: &BTreeMap<String, usize>) -> String {
    let total: usize = counts.values().sum();
    if total == 0 {
        return "–".into();
    }
    let mut v: Vec<(&String, &usize)> = counts.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter().map(|(l, c)| format!("{l} {c} ({:.0} %)", **c as f64 * 100.0 / total as f64)).collect::<Vec<_>>().join("<br>")
}

pub fn load(dir: &Path) -> Result<Loaded> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ReplayError::io(&path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    if v.get("kind").and_then(|k| k.as_str()) == Some("runs") {
        Ok(Loaded::Runs(Box::new(serde_json::from_value(v)?)))
    } else {
        Ok(Loaded::Run(Box::new(serde_json::from_value(v)?)))
    }
}

/// A markdown table, one column per directory.
pub fn table(dirs: &[&Path]) -> Result<String> {
    let loaded: Vec<Loaded> = dirs.iter().map(|d| load(d)).collect::<Result<_>>()?;
    let mut md = String::new();
    let _ = write!(md, "| |");
    for d in dirs {
        let _ = write!(md, " {} |", d.display());
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(dirs.len()));
    md.push('\n');
    let mut row = |name: &str, f: &dyn Fn(&Loaded) -> String| {
        let _ = write!(md, "| {name} |");
        for l in &loaded {
            let _ = write!(md, " {} |", f(l));
        }
        md.push('\n');
    };
    row("workload", &|l| l.meta().workload.clone());
    row("endpoint", &|l| l.meta().endpoint.clone());
    row("time scale", &|l| l.meta().time_scale.to_string());
    row("concurrency", &|l| l.meta().concurrency.to_string());
    row("runs", &|l| l.runs().to_string());
    for (key, name) in HEADLINE_ORDER {
        row(name, &|l| l.cell(key));
    }
    let paths: Vec<String> = dirs.iter().zip(&loaded).map(|(d, l)| path_counts(d, l).map(|c| path_cell(&c))).collect::<Result<_>>()?;
    let _ = write!(md, "| path mix (requests, all runs) |");
    for p in &paths {
        let _ = write!(md, " {p} |");
    }
    md.push('\n');
    let first = loaded[0].meta();
    if loaded.iter().any(|l| l.meta().time_scale != first.time_scale) {
        md.push_str("\n**Warning:** the time scales differ; these runs did not offer the same load.\n");
    }
    if loaded.iter().any(|l| l.meta().workload != first.workload) {
        md.push_str("\n**Warning:** the workloads differ.\n");
    }
    if loaded.iter().any(|l| l.runs() < 2) {
        md.push_str("\nSingle runs have no spread: differences under ~30 % may be noise (one run is an anecdote).\n");
    }
    Ok(md)
}
