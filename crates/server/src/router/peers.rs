//! The router's workers: their polled `/internal/state`, their health, and
//! the requests the router has in flight on each.
//!
//! Each worker is polled every `--peer-poll-interval-s`. A failed poll (no
//! answer, an error status, a body that is not a `WorkerState`) or
//! `ready: false` marks it unhealthy; so does a failed forward (see
//! [`super::proxy`]). An unhealthy worker is polled again after an
//! exponential backoff ([`crate::peer_poll`], shared with the decode
//! worker's poller, as is the health record [`PeerHealth`]) and takes
//! requests again once a poll succeeds. Every transition is an
//! `event="peer_health"` log line and a count in
//! `kvc_router_peer_health_changes_total{worker,to}`. What is the router's
//! own: the requests and blocks it has in flight on each worker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvc_disagg::protocol::WorkerState;
use kvc_disagg::routing::{worker_view, WorkerView};

use super::metrics::RouterMetrics;
use crate::in_flight::{InFlight, Sent};
use crate::peer_poll::{spawn_pollers, PeerHealth, Polled, Transition};
use crate::prom::Family;

/// One worker behind the router.
#[derive(Debug)]
pub struct Peer {
    /// Base URL without a trailing slash (`http://host:port`).
    pub url: String,
    health: PeerHealth,
    /// Requests the router is forwarding to it now.
    requests: Arc<InFlight>,
    /// The blocks those requests were estimated to need.
    blocks: Arc<InFlight>,
}

impl Peer {
    pub fn new(url: &str) -> Self {
        Self { url: url.trim_end_matches('/').to_string(), health: PeerHealth::default(), requests: Arc::default(), blocks: Arc::default() }
    }

    pub fn is_healthy(&self) -> bool {
        self.health.is_healthy()
    }

    pub fn in_flight(&self) -> usize {
        self.requests.get()
    }

    /// Counts a forwarded request, estimated to need `blocks`, until the
    /// guard drops.
    pub fn start_request(&self, blocks: usize) -> Forwarded {
        Forwarded { _request: self.requests.send(1), _blocks: self.blocks.send(blocks) }
    }

    /// When the last good poll answered.
    pub fn polled_at(&self) -> Option<Instant> {
        self.health.read(|h| h.polled_at)
    }

    /// Whether the last polled state lists `session` (exact match).
    pub fn holds_session(&self, session: &str) -> bool {
        self.health.read(|h| h.state.as_ref().is_some_and(|s| s.sessions.contains_key(session)))
    }

    /// The policy's view of this worker for a request of `session`. Load is
    /// corrected by what the router knows more recently than the poll
    /// ([`InFlight::correct`]): the polled running + waiting and blocks in
    /// use, minus the router's requests (and their estimated blocks)
    /// counted in them, plus the router's requests now.
    pub fn view(&self, session: Option<&str>) -> WorkerView {
        self.health.read(|h| {
            let Some(state) = &h.state else {
                return WorkerView::default();
            };
            let mut view = worker_view(state, h.healthy, session);
            view.active = self.requests.correct(view.active);
            let used = self.blocks.correct(view.total_blocks.saturating_sub(view.available_blocks()));
            view.free_blocks = view.total_blocks.saturating_sub(view.evictable_blocks).saturating_sub(used);
            view
        })
    }

    /// A poll of this worker is being sent ([`InFlight::mark_polling`]).
    pub(crate) fn mark_polling(&self) {
        self.requests.mark_polling();
        self.blocks.mark_polling();
    }

    /// Records a poll's outcome ([`PeerHealth::record_poll`]; a ready
    /// report also marks what the router had in flight when it came);
    /// returns the health transition, if any.
    fn record_poll(&self, result: Result<WorkerState, String>) -> Option<Transition> {
        self.health.record_poll(result, || {
            self.requests.mark_reported();
            self.blocks.mark_reported();
        })
    }

    fn failures(&self) -> u32 {
        self.health.failures()
    }
}

/// A forwarded request: counted in its worker's load until dropped (the
/// response body is finished or abandoned).
#[derive(Debug)]
pub struct Forwarded {
    _request: Sent,
    _blocks: Sent,
}

/// The workers' gauges, read from [`Peers`] at each scrape.
const GAUGES: &[Family] = &[
    Family::gauge("kvc_router_peer_healthy", "Whether the router sends requests to the worker (1) or not (0).", &["worker"]),
    Family::gauge("kvc_router_requests_in_flight", "Requests the router is forwarding to the worker now.", &["worker"]),
];

/// Every worker behind the router, in `--decode-peer` order (the order
/// breaks ties between equal scores).
#[derive(Debug)]
pub struct Peers {
    pub list: Vec<Arc<Peer>>,
    metrics: Arc<RouterMetrics>,
}

impl Peers {
    pub fn new(urls: &[String], metrics: Arc<RouterMetrics>) -> Self {
        let list: Vec<Arc<Peer>> = urls.iter().map(|u| Arc::new(Peer::new(u))).collect();
        for p in &list {
            metrics.add_worker(&p.url);
        }
        Self { list, metrics }
    }

    /// Adds the workers' health and in-flight gauges to the router's
    /// metrics, read at each scrape (weakly: the peers hold the metrics).
    pub fn export_gauges(self: &Arc<Self>) {
        let peers = Arc::downgrade(self);
        self.metrics.on_scrape(GAUGES, move |out| {
            for p in peers.upgrade().iter().flat_map(|peers| peers.list.iter()) {
                out.sample("kvc_router_peer_healthy", &[&p.url], p.is_healthy() as u8 as f64);
                out.sample("kvc_router_requests_in_flight", &[&p.url], p.in_flight() as f64);
            }
        });
    }

    pub fn healthy_count(&self) -> usize {
        self.list.iter().filter(|p| p.is_healthy()).count()
    }

    pub fn index_of(&self, url: &str) -> Option<usize> {
        self.list.iter().position(|p| p.url == url)
    }

    /// A forward to worker `i` failed before any response byte: unhealthy
    /// until a poll succeeds.
    pub fn mark_failed(&self, i: usize, error: &str) {
        let peer = &self.list[i];
        if let Some(t) = peer.health.record_failure(&format!("forward failed: {error}")) {
            self.log_transition(peer, &t);
        }
    }

    /// Records a poll of worker `i`, logging and counting a transition.
    pub(crate) fn apply_poll(&self, i: usize, result: Result<WorkerState, String>) {
        let peer = &self.list[i];
        if let Some(t) = peer.record_poll(result) {
            self.log_transition(peer, &t);
        }
    }

    fn log_transition(&self, peer: &Peer, t: &Transition) {
        let (healthy, why) = (t.healthy, &t.why);
        let to = if healthy { "healthy" } else { "unhealthy" };
        if healthy {
            tracing::info!(event = "peer_health", worker = %peer.url, to, reason = %why, "worker is healthy");
        } else {
            tracing::warn!(event = "peer_health", worker = %peer.url, to, reason = %why, "worker is unhealthy");
        }
        self.metrics.count_health_change(&peer.url, to);
    }

    /// Starts one polling task per worker; they run until the runtime stops.
    pub fn spawn_pollers(self: &Arc<Self>, client: reqwest::Client, token: String, interval: Duration) {
        let urls = self.list.iter().map(|p| p.url.clone()).collect();
        let peers = self.clone();
        let sending = self.clone();
        let on_send = move |i: usize| sending.list[i].mark_polling();
        spawn_pollers(urls, client, token, interval, on_send, move |i, outcome: Result<Polled, String>| {
            let peers = peers.clone();
            async move {
                peers.apply_poll(i, outcome.map(|p| p.state));
                peers.list[i].failures()
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_state(running: usize) -> WorkerState {
        WorkerState { ready: true, block_size: 16, total_blocks: 64, free_blocks: 64, running, ..Default::default() }
    }

    #[test]
    fn health_follows_polls_and_failed_forwards() {
        let metrics = Arc::new(RouterMetrics::default());
        let peers = Peers::new(&["http://a/".to_string()], metrics.clone());
        let peer = &peers.list[0];
        assert_eq!(peer.url, "http://a");
        assert!(!peer.is_healthy() && !peer.view(None).healthy, "unknown until polled");
        peers.apply_poll(0, Ok(ready_state(0)));
        assert!(peer.is_healthy() && peer.view(None).healthy);
        assert_eq!(peer.record_poll(Ok(ready_state(0))), None, "no transition");
        peers.mark_failed(0, "connection refused");
        assert!(!peer.is_healthy());
        assert_eq!(peer.failures(), 1);
        assert!(peer.record_poll(Err("down".into())).is_none());
        assert_eq!(peer.failures(), 2);
        let not_ready = WorkerState { ready: false, ..ready_state(0) };
        assert!(peer.record_poll(Ok(not_ready)).is_none());
        assert!(!peer.view(None).healthy);
        peers.apply_poll(0, Ok(ready_state(0)));
        assert!(peer.is_healthy());
        assert_eq!(peer.failures(), 0);
        assert_eq!(metrics.health_changes_for("http://a", "unhealthy"), 1);
        assert_eq!(metrics.health_changes_for("http://a", "healthy"), 2);
    }

    #[test]
    fn exports_each_workers_health_and_in_flight_gauges() {
        let metrics = Arc::new(RouterMetrics::default());
        let peers = Arc::new(Peers::new(&["http://a:1".to_string()], metrics.clone()));
        peers.export_gauges();
        let text = metrics.render();
        for line in [
            "kvc_router_peer_healthy{worker=\"http://a:1\"} 0",
            "kvc_router_requests_in_flight{worker=\"http://a:1\"} 0",
            "# TYPE kvc_router_peer_healthy gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn load_counts_the_routers_own_requests_once() {
        let peers = Peers::new(&["http://a".to_string()], Arc::new(RouterMetrics::default()));
        let peer = &peers.list[0];
        let first = peer.start_request(10);
        // The poll sees the router's request running (12 blocks in use)
        // plus one from elsewhere (4 blocks).
        peer.record_poll(Ok(WorkerState { free_blocks: 48, ..ready_state(2) }));
        let v = peer.view(None);
        assert_eq!((v.active, v.free_blocks), (2, 48));
        let second = peer.start_request(6);
        let v = peer.view(None);
        assert_eq!((v.active, v.free_blocks), (3, 42), "a request sent after the poll counts at once");
        drop((first, second));
        let v = peer.view(None);
        assert_eq!((v.active, v.free_blocks), (1, 58), "finished requests stop counting before the next poll");
    }
}
