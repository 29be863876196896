//! The router's metrics, in its own registry ([`crate::prom`]; `GET /metrics`).
//!
//! - `kvc_router_requests_total{worker,status}`: answers, by the worker that
//!   gave them (`none` when the router answered itself) and HTTP status.
//! - `kvc_decisions_total{decision,outcome,reason}`: the router's
//!   decisions (`route_score`: placements), every label set at 0 from the
//!   start.
//! - `kvc_router_session_moves_total{reason}`: sessions placed on a worker
//!   other than the one that served their last turn.
//! - `kvc_router_retries_total`: forwards retried on another worker.
//! - `kvc_router_peer_health_changes_total{worker,to}`.
//! - `kvc_router_peer_healthy{worker}` (1 healthy, 0 not) and
//!   `kvc_router_requests_in_flight{worker}`, read from the workers at
//!   each scrape ([`super::peers::Peers::export_gauges`]).

use prometheus::{IntCounter, IntCounterVec, Registry};

use kvc_disagg::routing::{RouteDecision, RouteReason};

use crate::prom::{self, Family, Scrape, ScrapeTime};

/// The router's metrics and its one registry.
pub struct RouterMetrics {
    registry: Registry,
    requests: IntCounterVec,
    moves: IntCounterVec,
    health_changes: IntCounterVec,
    retries: IntCounter,
}

impl Default for RouterMetrics {
    fn default() -> Self {
        let r = Registry::new();
        let m = Self {
            requests: prom::counter_vec(
                &r,
                "kvc_router_requests_total",
                "Answers to generation requests, by worker (none: the router's own) and HTTP status.",
                &["worker", "status"],
            ),
            moves: prom::counter_vec(
                &r,
                "kvc_router_session_moves_total",
                "Sessions placed on another worker than their last turn's, by reason.",
                &["reason"],
            ),
            health_changes: prom::counter_vec(
                &r,
                "kvc_router_peer_health_changes_total",
                "Health transitions of each worker, by the state entered.",
                &["worker", "to"],
            ),
            retries: prom::counter(
                &r,
                "kvc_router_retries_total",
                "Forwards retried on another worker after the first failed before any answer.",
            ),
            registry: r,
        };
        // Closed label sets start at 0 (dashboards expect every series).
        for reason in RouteReason::MOVES {
            m.moves.with_label_values(&[reason.as_str()]);
        }
        crate::metrics::register_decisions(&m.registry, true);
        m
    }
}

impl std::fmt::Debug for RouterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterMetrics").finish_non_exhaustive()
    }
}

impl RouterMetrics {
    /// Adds `families` to the router's registry, their values given by
    /// `read` at each scrape.
    pub fn on_scrape(&self, families: &[Family], read: impl Fn(&mut Scrape) + Send + Sync + 'static) {
        ScrapeTime::register(&self.registry, families, read);
    }

    pub fn count_request(&self, worker: &str, status: u16) {
        self.requests.with_label_values(&[worker, &status.to_string()]).inc();
    }

    /// Counts a placement and logs it: a `route_score` decision
    /// (`kvc_decisions_total`, process-wide: a router is one process).
    pub fn count_decision(&self, decision: &RouteDecision) {
        kvc_policy::log_decision(&decision.decision());
    }

    /// Counts a session moved off its home, by the placement's reason.
    pub fn count_move(&self, reason: RouteReason) {
        self.moves.with_label_values(&[reason.as_str()]).inc();
    }

    pub fn count_retry(&self) {
        self.retries.inc();
    }

    /// Shows `worker`'s health transitions at 0 until one is counted.
    pub fn add_worker(&self, worker: &str) {
        for to in ["healthy", "unhealthy"] {
            self.health_changes.with_label_values(&[worker, to]);
        }
    }

    pub fn count_health_change(&self, worker: &str, to: &'static str) {
        self.health_changes.with_label_values(&[worker, to]).inc();
    }

    pub fn health_changes_for(&self, worker: &str, to: &'static str) -> u64 {
        self.health_changes.get_metric_with_label_values(&[worker, to]).map(|c| c.get()).unwrap_or(0)
    }

    /// The exposition text of the router's registry.
    pub fn render(&self) -> String {
        prom::encode(&self.registry)
    }
}

/// Test support: placements are counted process-wide
/// (`kvc_decisions_total`), so the tests that place requests take turns
/// ([`turn`]) and read a count before and after.
#[cfg(test)]
pub(crate) mod counted {
    use super::RouteReason;
    use kvc_policy::decision::Reason;

    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Held by each test that places requests, for the whole test.
    pub(crate) async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
        TURN.lock().await
    }

    /// [`turn`], outside a runtime.
    pub(crate) fn blocking_turn() -> tokio::sync::MutexGuard<'static, ()> {
        TURN.blocking_lock()
    }

    /// Placements with `reason` in this process so far.
    pub(crate) fn placements(reason: RouteReason) -> u64 {
        kvc_policy::decisions_total::counts()
            .into_iter()
            .filter(|(s, _)| s.decision == RouteReason::DECISION && s.reason == reason.label())
            .map(|(_, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_router_metric_with_labels() {
        let _turn = counted::blocking_turn();
        let m = RouterMetrics::default();
        m.count_request("http://a:1", 200);
        m.count_request("http://a:1", 200);
        m.count_request("none", 503);
        let d = RouteDecision { worker: None, reason: RouteReason::LeastCost, home: None, scores: Vec::new() };
        let placed = counted::placements(RouteReason::LeastCost);
        m.count_decision(&d);
        assert_eq!(counted::placements(RouteReason::LeastCost), placed + 1);
        m.count_move(RouteReason::MovedFull);
        m.count_retry();
        m.count_health_change("http://a:1", "unhealthy");
        let text = m.render();
        for line in [
            "kvc_router_requests_total{worker=\"http://a:1\",status=\"200\"} 2",
            "kvc_router_requests_total{worker=\"none\",status=\"503\"} 1",
            "kvc_router_session_moves_total{reason=\"moved_full\"} 1",
            "kvc_router_retries_total 1",
            "kvc_router_peer_health_changes_total{worker=\"http://a:1\",to=\"unhealthy\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Every route decision's label set (counted process-wide), no worker's.
        let decisions: Vec<_> = text.lines().filter(|l| l.starts_with("kvc_decisions_total{")).collect();
        assert_eq!(decisions.len(), 7, "{decisions:?}");
        assert!(decisions.iter().all(|l| l.starts_with("kvc_decisions_total{decision=\"route_score\",")), "{decisions:?}");
        assert!(text.contains("kvc_decisions_total{decision=\"route_score\",outcome=\"refuse\",reason=\"no_healthy_worker\"} "));
        let least_cost = format!("kvc_decisions_total{{decision=\"route_score\",outcome=\"place\",reason=\"least_cost\"}} {}", placed + 1);
        assert!(text.lines().any(|l| l == least_cost), "missing {least_cost:?} in\n{text}");
    }
}
