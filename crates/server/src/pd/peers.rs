//! A decode worker's view of its prefill workers: each one's published
//! state (`GET /internal/state`), polled every `--peer-poll-interval-s`
//! with the router's poller ([`crate::peer_poll`]: the same deadline,
//! backoff and health record, [`PeerHealth`]). A failed poll or call marks
//! the peer unhealthy until a poll succeeds. What is the decode worker's
//! own: the prompt tokens it has sent each peer and not had answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvc_disagg::prefill_peer::{choose_peer, PeerCandidate};
use kvc_disagg::protocol::WorkerState;

use super::metrics::PdMetrics;
use crate::cluster_token::CLUSTER_TOKEN_HEADER;
use crate::in_flight::{InFlight, Sent};
use crate::peer_poll::{spawn_pollers, PeerHealth, Polled, Transition};

#[derive(Debug, Clone, Default)]
pub struct PeerStatus {
    pub url: String,
    pub healthy: bool,
    pub state: Option<WorkerState>,
    /// Consecutive failed polls (the poller's backoff).
    pub failures: u32,
}

/// HTTP to peers: the cluster token on every call.
#[derive(Clone)]
pub struct PeerClient {
    pub http: reqwest::Client,
    token: String,
}

impl PeerClient {
    pub fn new(token: &str) -> Self {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(2)).build().expect("HTTP client builds");
        Self { http, token: token.to_string() }
    }

    pub fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.http.get(url).header(CLUSTER_TOKEN_HEADER, &self.token)
    }

    pub fn post(&self, url: &str) -> reqwest::RequestBuilder {
        self.http.post(url).header(CLUSTER_TOKEN_HEADER, &self.token)
    }
}

/// One prefill worker: its base URL and health.
struct PrefillPeer {
    url: String,
    health: PeerHealth,
}

pub struct PrefillPeers {
    peers: Vec<PrefillPeer>,
    /// Prompt tokens this worker has asked each peer to compute and whose
    /// answer has not come back (by URL).
    sent: Mutex<HashMap<String, Arc<InFlight>>>,
}

impl PrefillPeers {
    pub fn new(urls: &[String]) -> Self {
        let peers = urls.iter().map(|u| PrefillPeer { url: u.trim_end_matches('/').to_string(), health: PeerHealth::default() }).collect();
        Self { peers, sent: Mutex::new(HashMap::new()) }
    }

    fn sent_to(&self, peer: &PeerStatus) -> Arc<InFlight> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).entry(peer.url.clone()).or_default().clone()
    }

    /// A remote prefill in flight: its `tokens` count in [`Self::backlog`]
    /// until the returned guard drops (answer, error or cancelled request
    /// alike).
    pub fn dispatch(&self, peer: &PeerStatus, tokens: usize) -> Sent {
        self.sent_to(peer).send(tokens)
    }

    /// The peer's prefill backlog as far as this worker knows: what it last
    /// reported, or what this worker has sent it and not had answered if
    /// that is more ([`InFlight::at_least`]). Its report lags by up to a
    /// poll interval plus one of its steps; without this, requests placed
    /// in that window all saw an idle peer and queued behind each other
    /// there.
    pub fn backlog(&self, peer: &PeerStatus) -> usize {
        let reported = peer.state.as_ref().map_or(0, |s| s.pending_prefill_tokens);
        self.sent_to(peer).at_least(reported)
    }

    pub fn all(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let h = p.health.get();
                PeerStatus { url: p.url.clone(), healthy: h.healthy, state: h.state, failures: h.failures }
            })
            .collect()
    }

    /// The peer for `session` ([`choose_peer`]: its snapshot's holder, its
    /// stable home, else the least loaded healthy one; an unhealthy peer
    /// only if none is healthy, and the caller then falls back). The choice
    /// is counted in `kvc_decisions_total{decision="prefill_peer"}`.
    pub fn pick(&self, session: Option<&str>) -> Option<PeerStatus> {
        let peers = self.all();
        let candidates: Vec<PeerCandidate> = peers
            .iter()
            .map(|p| {
                let snap = session.and_then(|s| p.state.as_ref()?.snapshots.get(s).copied());
                PeerCandidate {
                    healthy: p.healthy,
                    load: p.state.as_ref().map(|s| s.running + s.waiting),
                    snapshot_tokens: snap.unwrap_or(0),
                    holds_snapshot: snap.is_some(),
                }
            })
            .collect();
        let (i, reason) = choose_peer(&candidates, session)?;
        kvc_policy::log_decision(&reason.decision());
        tracing::debug!(event = "prefill_peer", peer = %peers[i].url, reason = reason.as_str());
        Some(peers[i].clone())
    }

    /// Records a poll of peer `i` ([`PeerHealth::record_poll`]); returns
    /// its consecutive failures.
    pub fn apply_poll(&self, i: usize, outcome: Result<WorkerState, String>, metrics: &PdMetrics) -> u32 {
        let Some(p) = self.peers.get(i) else {
            return 0;
        };
        let transition = p.health.record_poll(outcome, || {});
        self.recorded(p, transition, metrics);
        p.health.failures()
    }

    /// A call to the peer at `url` failed: unhealthy until a poll succeeds.
    pub fn mark_failed(&self, url: &str, why: &str, metrics: &PdMetrics) {
        if let Some(p) = self.peers.iter().find(|p| p.url == url) {
            let transition = p.health.record_failure(why);
            self.recorded(p, transition, metrics);
        }
    }

    fn recorded(&self, p: &PrefillPeer, transition: Option<Transition>, metrics: &PdMetrics) {
        let healthy = p.health.is_healthy();
        if let Some(t) = transition {
            tracing::info!(event = "peer_health", peer = %p.url, healthy, reason = %t.why, "prefill peer health changed");
        }
        metrics.peer_healthy.with_label_values(&[&p.url]).set(if healthy { 1.0 } else { 0.0 });
    }

    /// Polls every peer on its own task, forever.
    pub fn spawn_pollers(self: &Arc<Self>, client: &PeerClient, interval: Duration, metrics: PdMetrics) {
        let urls: Vec<String> = self.peers.iter().map(|p| p.url.clone()).collect();
        let (peers, names) = (self.clone(), Arc::new(urls.clone()));
        // Backlogs are read with `at_least`, which needs no report marks.
        spawn_pollers(
            urls,
            client.http.clone(),
            client.token.clone(),
            interval,
            |_| {},
            move |i, outcome: Result<Polled, String>| {
                let (peers, metrics, url) = (peers.clone(), metrics.clone(), names[i].clone());
                async move {
                    let outcome = match outcome {
                        Ok(p) => {
                            // The peer we call with the token may connect to our
                            // KV transport (it writes prefilled KV into our pool).
                            if let Some(a) = p.remote {
                                kvc_disagg::transport::allow_peer(a.ip());
                            }
                            Ok(p.state)
                        }
                        Err(e) => {
                            tracing::debug!(event = "peer_poll_failed", peer = %url, error = %e);
                            Err(e)
                        }
                    };
                    peers.apply_poll(i, outcome, &metrics)
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reporting(peers: &PrefillPeers, pending: usize) -> PeerStatus {
        let state = WorkerState { pending_prefill_tokens: pending, ready: true, ..Default::default() };
        peers.apply_poll(0, Ok(state), &PdMetrics::default());
        peers.all().remove(0)
    }

    #[test]
    fn the_backlog_counts_what_was_sent_until_answered_when_reports_lag() {
        let peers = PrefillPeers::new(&["http://p/".to_string()]);
        let p = reporting(&peers, 1_000);
        assert_eq!(peers.backlog(&p), 1_000);
        // Two prefills sent; P has not reported them yet.
        let a = peers.dispatch(&p, 50_000);
        let b = peers.dispatch(&p, 7_000);
        assert_eq!(peers.backlog(&p), 57_000);
        // A report that includes them and more wins.
        let p = reporting(&peers, 60_000);
        assert_eq!(peers.backlog(&p), 60_000);
        drop(a);
        let p = reporting(&peers, 0);
        assert_eq!(peers.backlog(&p), 7_000);
        drop(b);
        assert_eq!(peers.backlog(&p), 0);
    }
}
