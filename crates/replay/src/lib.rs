//! kvc-replay: replays real and synthetic multi-turn traces against any
//! OpenAI-compatible endpoint and reports what happened (issue 7).
//!
//! Flow: a trace ([`trace`]) or generator ([`synth`]) gives a
//! [`trace::Workload`]; the [`driver`] sends it in real time through the
//! [`client`] (over [`http`] and [`sse`]), scraping /metrics ([`scrape`]);
//! rows ([`metrics`]) become a [`summary`] and a [`report`]; [`runs`]
//! aggregates repeats and [`compare`] puts result directories side by side.

pub mod client;
pub mod compare;
pub mod driver;
pub mod error;
pub mod http;
pub mod metrics;
pub mod report;
pub mod reuse;
pub mod runs;
pub mod scrape;
pub mod sse;
pub mod stats;
pub mod summary;
pub mod svg;
pub mod synth;
pub mod trace;

pub use error::{ReplayError, Result};
