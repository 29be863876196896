//! The router's counters and their Prometheus text (`GET /metrics`).
//!
//! - `kvc_router_requests_total{worker,status}`: answers, by the worker that
//!   gave them (`none` when the router answered itself) and HTTP status.
//! - `kvc_router_decisions_total{reason}`: placement decisions.
//! - `kvc_router_session_moves_total{reason}`: sessions placed on a worker
//!   other than the one that served their last turn.
//! - `kvc_router_retries_total`: forwards retried on another worker.
//! - `kvc_router_peer_healthy{worker}`: 1 healthy, 0 not.
//! - `kvc_router_peer_health_changes_total{worker,to}`.
//! - `kvc_router_requests_in_flight{worker}`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::peers::Peers;
use crate::prom_text::labels;

#[derive(Debug, Default)]
pub struct RouterMetrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    decisions: Mutex<BTreeMap<&'static str, u64>>,
    moves: Mutex<BTreeMap<&'static str, u64>>,
    health_changes: Mutex<BTreeMap<(String, &'static str), u64>>,
    retries: AtomicU64,
}

fn bump<K: Ord>(map: &Mutex<BTreeMap<K, u64>>, key: K) {
    *map.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default() += 1;
}

fn snapshot<K: Ord + Clone>(map: &Mutex<BTreeMap<K, u64>>) -> BTreeMap<K, u64> {
    map.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

impl RouterMetrics {
    pub fn count_request(&self, worker: &str, status: u16) {
        bump(&self.requests, (worker.to_string(), status));
    }

    pub fn count_decision(&self, reason: &'static str) {
        bump(&self.decisions, reason);
    }

    pub fn count_move(&self, reason: &'static str) {
        bump(&self.moves, reason);
    }

    pub fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_health_change(&self, worker: &str, to: &'static str) {
        bump(&self.health_changes, (worker.to_string(), to));
    }

    pub fn health_changes_for(&self, worker: &str, to: &'static str) -> u64 {
        self.health_changes.lock().unwrap_or_else(|e| e.into_inner()).get(&(worker.to_string(), to)).copied().unwrap_or(0)
    }

    /// The exposition text; one `# HELP` / `# TYPE` pair per metric.
    pub fn render(&self, peers: &Peers) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let requests: BTreeMap<(String, u16), u64> = snapshot(&self.requests);
        metric(
            "kvc_router_requests_total",
            "counter",
            "Answers to generation requests, by worker (none: the router's own) and HTTP status.",
            requests.iter().map(|((w, s), n)| (labels(&[("worker", w), ("status", &s.to_string())]), *n)).collect(),
        );
        let by_reason = |m: BTreeMap<&'static str, u64>| m.into_iter().map(|(r, n)| (labels(&[("reason", r)]), n)).collect();
        metric("kvc_router_decisions_total", "counter", "Placement decisions, by reason.", by_reason(snapshot(&self.decisions)));
        metric(
            "kvc_router_session_moves_total",
            "counter",
            "Sessions placed on another worker than their last turn's, by reason.",
            by_reason(snapshot(&self.moves)),
        );
        metric(
            "kvc_router_retries_total",
            "counter",
            "Forwards retried on another worker after the first failed before any answer.",
            vec![(String::new(), self.retries.load(Ordering::Relaxed))],
        );
        metric(
            "kvc_router_peer_healthy",
            "gauge",
            "Whether the router sends requests to the worker (1) or not (0).",
            peers.list.iter().map(|p| (labels(&[("worker", &p.url)]), p.is_healthy() as u64)).collect(),
        );
        metric(
            "kvc_router_requests_in_flight",
            "gauge",
            "Requests the router is forwarding to the worker now.",
            peers.list.iter().map(|p| (labels(&[("worker", &p.url)]), p.in_flight() as u64)).collect(),
        );
        let changes: BTreeMap<(String, &'static str), u64> = snapshot(&self.health_changes);
        metric(
            "kvc_router_peer_health_changes_total",
            "counter",
            "Health transitions of each worker, by the state entered.",
            changes.iter().map(|((w, to), n)| (labels(&[("worker", w), ("to", to)]), *n)).collect(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn renders_every_router_metric_with_labels() {
        let m = Arc::new(RouterMetrics::default());
        let peers = Peers::new(&["http://a:1".to_string()], m.clone());
        m.count_request("http://a:1", 200);
        m.count_request("http://a:1", 200);
        m.count_request("none", 503);
        m.count_decision("least_cost");
        m.count_move("moved_full");
        m.count_retry();
        m.count_health_change("http://a:1", "unhealthy");
        let text = m.render(&peers);
        for line in [
            "kvc_router_requests_total{worker=\"http://a:1\",status=\"200\"} 2",
            "kvc_router_requests_total{worker=\"none\",status=\"503\"} 1",
            "kvc_router_decisions_total{reason=\"least_cost\"} 1",
            "kvc_router_session_moves_total{reason=\"moved_full\"} 1",
            "kvc_router_retries_total 1",
            "kvc_router_peer_healthy{worker=\"http://a:1\"} 0",
            "kvc_router_requests_in_flight{worker=\"http://a:1\"} 0",
            "kvc_router_peer_health_changes_total{worker=\"http://a:1\",to=\"unhealthy\"} 1",
            "# TYPE kvc_router_peer_healthy gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
