//! `--runs N`: the same workload N times; the headline numbers' median and
//! spread across runs (one run is an anecdote).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::file::write_file;
use crate::run_meta::{meta_table, RunMeta};
use crate::stats::median;
use crate::summary::{fmt_value, Summary, HEADLINE_ORDER};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// (max - min) / |median|; `None` when the median is 0.
    pub spread: Option<f64>,
    pub values: Vec<f64>,
}

impl Spread {
    pub fn of(values: Vec<f64>) -> Option<Spread> {
        let med = median(&values)?;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Spread { median: med, min, max, spread: (med != 0.0).then(|| (max - min) / med.abs()), values })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// Always "runs": tells this file from a single run's summary.
    pub kind: String,
    pub meta: RunMeta,
    pub runs: usize,
    pub run_dirs: Vec<String>,
    pub metrics: BTreeMap<String, Spread>,
}

impl Aggregate {
    pub fn new(summaries: &[Summary], run_dirs: Vec<String>) -> Aggregate {
        let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for s in summaries {
            for (k, v) in s.headline() {
                values.entry(k).or_default().push(v);
            }
        }
        let mut meta = summaries[0].meta.clone();
        meta.run = 0;
        meta.salt = 0;
        meta.wall_s = summaries.iter().map(|s| s.meta.wall_s).sum();
        meta.interrupted = summaries.iter().any(|s| s.meta.interrupted);
        meta.stop_reason = summaries.iter().find_map(|s| s.meta.stop_reason);
        Aggregate {
            kind: "runs".into(),
            meta,
            runs: summaries.len(),
            run_dirs,
            metrics: values.into_iter().filter_map(|(k, v)| Some((k, Spread::of(v)?))).collect(),
        }
    }

    pub fn markdown(&self) -> String {
        let mut md = format!("# kvc-replay report: {} runs\n\n", self.runs);
        md.push_str(&meta_table(&self.meta));
        md.push_str(
            "\nEach run replays the same workload with its own token salt and session ids, so no run reuses \
             another's cache. Differences between configurations smaller than the spread below are noise.\n\n\
             | metric | median | min | max | spread | per run |\n|---|---|---|---|---|---|\n",
        );
        for (key, name) in HEADLINE_ORDER {
            if let Some(s) = self.metrics.get(*key) {
                let per_run: Vec<String> = s.values.iter().map(|v| fmt_value(*v)).collect();
                let spread = s.spread.map_or("–".into(), |x| format!("{:.1} %", x * 100.0));
                let (med, min, max) = (fmt_value(s.median), fmt_value(s.min), fmt_value(s.max));
                let _ = writeln!(md, "| {name} | {med} | {min} | {max} | {spread} | {} |", per_run.join(", "));
            }
        }
        md.push_str("\nPer-run reports: ");
        let links: Vec<String> = self.run_dirs.iter().map(|d| format!("[{d}]({d}/summary.md)")).collect();
        md.push_str(&links.join(", "));
        md.push('\n');
        md
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        write_file(&dir.join("summary.json"), &serde_json::to_string_pretty(self)?)?;
        write_file(&dir.join("summary.md"), &self.markdown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_range_over_median() {
        let s = Spread::of(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.spread), (2.0, 1.0, 3.0, Some(1.0)));
        assert!(Spread::of(vec![]).is_none());
        assert_eq!(Spread::of(vec![0.0, 0.0]).unwrap().spread, None);
    }
}
