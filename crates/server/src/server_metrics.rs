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
//!
//! Closed label sets are exported at 0 from the start. Decisions (the
//! admission probe's answers, `--max-queue-delay-s`'s) are counted in
//! `kvc_decisions_total` ([`crate::metrics::register_decisions`]).

use prometheus::{Histogram, IntCounter, IntCounterVec, Registry};

use crate::prom;

/// Time to first token, in seconds (vLLM's buckets).
pub const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
/// Time between two tokens of one sequence, in seconds (vLLM's buckets
/// plus 0.04, the decode-latency target issue 17 checks).
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Whole-request and queue times, in seconds (vLLM's buckets).
pub const REQUEST_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];

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

/// The server's metrics, registered in its registry (which the engine's,
/// the admission gauges' and the P/D metrics join: one `/metrics`).
pub struct ServerMetrics {
    pub registry: Registry,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub admission_wait: Histogram,
    pub prefill_wait: Histogram,
    /// Answers by status class, 1xx..5xx.
    status: IntCounterVec,
    finishes: IntCounterVec,
    /// Requests handed to the engine on the `local` path (single worker).
    pub local_requests: IntCounter,
    /// Streams whose client went away before the end (cancelled).
    pub streams_cancelled: IntCounter,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new(Registry::new())
    }
}

impl ServerMetrics {
    /// The server's metrics, registered in `registry`.
    pub fn new(registry: Registry) -> Self {
        let r = &registry;
        let status = prom::counter_vec(r, "kvc_requests_total", "HTTP requests answered, by status class.", &["status"]);
        for class in 1..=5 {
            status.with_label_values(&[&format!("{class}xx")]);
        }
        let finishes = prom::counter_vec(r, "kvc_request_finishes_total", "Generated choices, by how they ended.", &["reason"]);
        for f in Finish::ALL {
            finishes.with_label_values(&[f.as_str()]);
        }
        let served = prom::counter_vec(r, "kvc_served_requests_total", "Requests handed to the engine, by serving path.", &["path"]);
        Self {
            ttft: prom::histogram(r, "kvc_time_to_first_token_seconds", "Request arrival to the first generated token.", TTFT_BUCKETS),
            itl: prom::histogram(r, "kvc_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", ITL_BUCKETS),
            e2e: prom::histogram(r, "kvc_e2e_request_latency_seconds", "Request arrival to the end of its last choice.", REQUEST_BUCKETS),
            queue: prom::histogram(
                r,
                "kvc_request_queue_time_seconds",
                "Request arrival to admission (concurrency slot taken, handed to the engine).",
                REQUEST_BUCKETS,
            ),
            admission_wait: prom::histogram(
                r,
                "kvc_engine_admission_wait_seconds",
                "Time a sequence waited in the engine, before its first token, for KV memory or a sequence slot.",
                REQUEST_BUCKETS,
            ),
            prefill_wait: prom::histogram(
                r,
                "kvc_engine_prefill_wait_seconds",
                "Time a sequence waited in the engine, before its first token, behind other prompts' prefills.",
                REQUEST_BUCKETS,
            ),
            status,
            finishes,
            local_requests: served.with_label_values(&[kvc_engine::ServePath::Local.as_str()]),
            streams_cancelled: prom::counter(
                r,
                "kvc_streams_cancelled_total",
                "Streaming responses whose client went away before the end.",
            ),
            registry,
        }
    }

    pub fn count_status(&self, status: u16) {
        if (100..600).contains(&status) {
            self.status.with_label_values(&[&format!("{}xx", status / 100)]).inc();
        }
    }

    pub fn count_finish(&self, finish: Finish) {
        self.finishes.with_label_values(&[finish.as_str()]).inc();
    }

    /// The exposition of the whole registry.
    pub fn render(&self) -> String {
        prom::encode(&self.registry)
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
        let text = m.render();
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

    #[test]
    fn a_fresh_registry_lists_every_closed_label_set_at_0() {
        let text = ServerMetrics::default().render();
        let at_0 = |name: &str, label: &str, values: &[&str]| {
            let listed: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).collect();
            assert_eq!(listed.len(), values.len(), "{name}: {listed:?}");
            for v in values {
                let line = format!("{name}{{{label}=\"{v}\"}} 0");
                assert!(listed.contains(&line.as_str()), "missing {line:?} in\n{text}");
            }
        };
        at_0("kvc_request_finishes_total", "reason", &Finish::ALL.map(Finish::as_str));
        at_0("kvc_requests_total", "status", &["1xx", "2xx", "3xx", "4xx", "5xx"]);
        at_0("kvc_served_requests_total", "path", &["local"]);
    }
}
