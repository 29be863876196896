//! kvc-replay: replays real and synthetic multi-turn traces against any
//! OpenAI-compatible endpoint and reports what happened (issue 7).
//!
//! Flow: a trace ([`trace`]) or generator ([`synth`]) gives a
//! [`trace::Workload`]; the [`driver`] sends it in real time ([`pacing`])
//! through the [`client`] (over [`http`] and [`sse`]), scraping /metrics
//! ([`scrape`]); rows ([`metrics`]) are appended to the run's directory as
//! they happen ([`run_dir`], [`jsonl`], with its description [`run_meta`])
//! and become a [`summary`] and a [`report`] at the end, or at a stop
//! ([`stop`]: SIGINT, SIGTERM, `--duration-s`), or later from the rows
//! alone (`kvc-replay report`); [`runs`] aggregates repeats and
//! [`compare`] puts result directories side by side.

pub mod client;
pub mod compare;
pub mod driver;
pub mod error;
pub mod file;
pub mod http;
pub mod jsonl;
pub mod metrics;
pub mod named;
pub mod pacing;
pub mod report;
pub mod reuse;
pub mod run_dir;
pub mod run_meta;
pub mod runs;
pub mod scrape;
pub mod sse;
pub mod stats;
pub mod stop;
pub mod summary;
pub mod svg;
pub mod synth;
pub mod trace;

pub use error::{ReplayError, Result};
