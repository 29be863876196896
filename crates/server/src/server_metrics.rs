//! The server's own Prometheus metrics (next to the engine's in
//! `/metrics`): latency histograms and request counters.
//!
//! - `kvc_time_to_first_token_seconds`: arrival of the HTTP request until
//!   the engine's first token for it (any choice).
//! - `kvc_inter_token_latency_seconds`: between consecutive tokens of one
//!   sequence.
//! - `kvc_e2e_request_latency_seconds`: arrival until the last choice
//!   finished.
//! - `kvc_request_queue_time_seconds`: arrival until the request was
//!   admitted (got a concurrency slot) and handed to the engine. The
//!   engine's own waiting queue (no free batch slot or KV blocks) is not in
//!   it; that time shows up in time to first token.
//! - `kvc_engine_admission_wait_seconds`: time a sequence waited in the
//!   engine before its first token for KV memory or a sequence slot.
//! - `kvc_engine_prefill_wait_seconds`: time it waited, admitted or not,
//!   behind other prompts' prefills (prefill slots, long-prefill slots,
//!   the step's token budget).
//! - `kvc_requests_total{status}`: answered HTTP requests by status class
//!   (a stream counts as 2xx once its headers went out, whatever ends it).
//! - `kvc_request_finishes_total{reason}`: generated choices by how they
//!   ended: stop, length, tool_calls, abort (client gone), timeout,
//!   shutdown, error.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::histogram::{Histogram, ITL_BUCKETS, REQUEST_BUCKETS, TTFT_BUCKETS};

/// How one choice (one engine sequence) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    /// The client went away.
    Abort,
    /// `--request-timeout-s` passed.
    Timeout,
    /// Cancelled by a shutdown whose grace period ran out.
    Shutdown,
    Error,
}

impl Finish {
    const ALL: [Finish; 7] =
        [Finish::Stop, Finish::Length, Finish::ToolCalls, Finish::Abort, Finish::Timeout, Finish::Shutdown, Finish::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
            Finish::Abort => "abort",
            Finish::Timeout => "timeout",
            Finish::Shutdown => "shutdown",
            Finish::Error => "error",
        }
    }

    /// From an OpenAI `finish_reason`.
    pub fn from_reason(reason: &str) -> Self {
        match reason {
            "stop" => Finish::Stop,
            "length" => Finish::Length,
            "tool_calls" => Finish::ToolCalls,
            "abort" => Finish::Abort,
            _ => Finish::Error,
        }
    }
}

#[derive(Debug)]
pub struct ServerMetrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub admission_wait: Histogram,
    pub prefill_wait: Histogram,
    /// Answers by status class, 1xx..5xx.
    status: [AtomicU64; 5],
    finishes: [AtomicU64; Finish::ALL.len()],
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            admission_wait: Histogram::new(REQUEST_BUCKETS),
            prefill_wait: Histogram::new(REQUEST_BUCKETS),
            status: Default::default(),
            finishes: Default::default(),
        }
    }
}

impl ServerMetrics {
    pub fn count_status(&self, status: u16) {
        if let Some(c) = self.status.get((status / 100).wrapping_sub(1) as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn count_finish(&self, finish: Finish) {
        let i = Finish::ALL.iter().position(|&f| f == finish).expect("listed");
        self.finishes[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn finishes(&self, finish: Finish) -> u64 {
        let i = Finish::ALL.iter().position(|&f| f == finish).expect("listed");
        self.finishes[i].load(Ordering::Relaxed)
    }

    /// Appends the admission gauges (requests holding a slot, waiting).
    pub fn render_admission(out: &mut String, running: usize, queued: usize) {
        let _ = writeln!(out, "# HELP kvc_http_requests_running Generation requests holding a concurrency slot.");
        let _ = writeln!(out, "# TYPE kvc_http_requests_running gauge");
        let _ = writeln!(out, "kvc_http_requests_running {running}");
        let _ = writeln!(out, "# HELP kvc_http_requests_queued Generation requests waiting for a concurrency slot.");
        let _ = writeln!(out, "# TYPE kvc_http_requests_queued gauge");
        let _ = writeln!(out, "kvc_http_requests_queued {queued}");
    }

    /// Appends the exposition of every server metric.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP kvc_requests_total HTTP requests answered, by status class.");
        let _ = writeln!(out, "# TYPE kvc_requests_total counter");
        for (i, c) in self.status.iter().enumerate() {
            let _ = writeln!(out, "kvc_requests_total{{status=\"{}xx\"}} {}", i + 1, c.load(Ordering::Relaxed));
        }
        let _ = writeln!(out, "# HELP kvc_request_finishes_total Generated choices, by how they ended.");
        let _ = writeln!(out, "# TYPE kvc_request_finishes_total counter");
        for (f, c) in Finish::ALL.iter().zip(&self.finishes) {
            let _ = writeln!(out, "kvc_request_finishes_total{{reason=\"{}\"}} {}", f.as_str(), c.load(Ordering::Relaxed));
        }
        self.ttft.render(out, "kvc_time_to_first_token_seconds", "Request arrival to the first generated token.");
        self.itl.render(out, "kvc_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.");
        self.e2e.render(out, "kvc_e2e_request_latency_seconds", "Request arrival to the end of its last choice.");
        self.queue.render(
            out,
            "kvc_request_queue_time_seconds",
            "Request arrival to admission (concurrency slot taken, handed to the engine).",
        );
        self.admission_wait.render(
            out,
            "kvc_engine_admission_wait_seconds",
            "Time a sequence waited in the engine, before its first token, for KV memory or a sequence slot.",
        );
        self.prefill_wait.render(
            out,
            "kvc_engine_prefill_wait_seconds",
            "Time a sequence waited in the engine, before its first token, behind other prompts' prefills.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_and_finishes_are_counted_and_exposed() {
        let m = ServerMetrics::default();
        for s in [200, 200, 400, 401, 429, 500, 999, 0] {
            m.count_status(s);
        }
        m.count_finish(Finish::ToolCalls);
        m.count_finish(Finish::Timeout);
        m.ttft.observe(0.2);
        let mut text = String::new();
        m.render(&mut text);
        for line in [
            "kvc_requests_total{status=\"2xx\"} 2",
            "kvc_requests_total{status=\"4xx\"} 3",
            "kvc_requests_total{status=\"5xx\"} 1",
            "kvc_request_finishes_total{reason=\"tool_calls\"} 1",
            "kvc_request_finishes_total{reason=\"timeout\"} 1",
            "kvc_time_to_first_token_seconds_count 1",
            "# TYPE kvc_request_queue_time_seconds histogram",
            "# TYPE kvc_inter_token_latency_seconds histogram",
            "# TYPE kvc_e2e_request_latency_seconds histogram",
            "# TYPE kvc_engine_admission_wait_seconds histogram",
            "# TYPE kvc_engine_prefill_wait_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert_eq!(Finish::from_reason("length"), Finish::Length);
    }
}
