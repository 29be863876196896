//! Polling peers' published state (`GET /internal/state`), shared by the
//! router (its workers) and the decode worker (its prefill workers): one
//! poll deadline, one backoff, the cluster token on every call.
//!
//! Each peer has its own task: it polls every `interval` while the peer
//! answers, and after consecutive failures waits `interval x 2^failures`,
//! at most [`MAX_BACKOFF`]. What a poll means (health, load corrections) is
//! the caller's: it gets each outcome through a callback, and records it
//! in the peer's [`PeerHealth`] (one record of health, backoff failures
//! and transitions for both roles; each role keeps only its in-flight
//! corrections, [`crate::in_flight`], and its metrics).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvc_disagg::protocol::WorkerState;

use crate::cluster_token::CLUSTER_TOKEN_HEADER;

/// Longest wait between polls of a failing peer.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Deadline of one poll: generous, because a worker's HTTP threads share
/// the CPU with its engine.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(3);

/// A successful poll: the peer's state and the address that answered.
#[derive(Debug, Clone)]
pub struct Polled {
    pub state: WorkerState,
    pub remote: Option<SocketAddr>,
}

/// What is known of one peer: its last published state, whether it takes
/// work, and its consecutive failures (polls or calls; they set the
/// backoff, [`next_poll_delay`]).
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub healthy: bool,
    pub state: Option<WorkerState>,
    /// When the last poll answered a state.
    pub polled_at: Option<Instant>,
    pub failures: u32,
}

/// A change of a peer's health, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub healthy: bool,
    pub why: String,
}

/// One peer's [`Health`], as its poller and the calls to it record it
/// (unhealthy until the first poll succeeds).
#[derive(Debug, Default)]
pub struct PeerHealth {
    inner: Mutex<Health>,
}

impl PeerHealth {
    fn lock(&self) -> MutexGuard<'_, Health> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the health under its lock (no poll lands meanwhile).
    pub fn read<R>(&self, f: impl FnOnce(&Health) -> R) -> R {
        f(&self.lock())
    }

    pub fn get(&self) -> Health {
        self.lock().clone()
    }

    pub fn is_healthy(&self) -> bool {
        self.lock().healthy
    }

    pub fn failures(&self) -> u32 {
        self.lock().failures
    }

    /// Records a poll's outcome: a state is kept whatever it says, and the
    /// peer is healthy if it reports `ready: true` (then `on_ready` runs
    /// under the lock, so that no reader sees the new report without what
    /// the caller marks with it). Returns the transition, if any.
    pub fn record_poll(&self, outcome: Result<WorkerState, String>, on_ready: impl FnOnce()) -> Option<Transition> {
        let mut h = self.lock();
        let (healthy, why) = match outcome {
            Ok(state) => {
                let ready = state.ready;
                h.state = Some(state);
                h.polled_at = Some(Instant::now());
                if ready {
                    on_ready();
                    (true, "poll ok".to_string())
                } else {
                    (false, "worker reports ready: false".to_string())
                }
            }
            Err(e) => (false, e),
        };
        h.failures = if healthy { 0 } else { h.failures.saturating_add(1) };
        let changed = std::mem::replace(&mut h.healthy, healthy) != healthy;
        changed.then_some(Transition { healthy, why })
    }

    /// A call to the peer failed before any answer: unhealthy until a poll
    /// succeeds. Returns the transition if it was healthy.
    pub fn record_failure(&self, why: &str) -> Option<Transition> {
        let mut h = self.lock();
        h.failures = h.failures.saturating_add(1);
        std::mem::replace(&mut h.healthy, false).then(|| Transition { healthy: false, why: why.to_string() })
    }
}

/// The wait before the next poll: the interval while polls succeed, then
/// doubling with each consecutive failure up to [`MAX_BACKOFF`].
pub fn next_poll_delay(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    let factor = 2u32.saturating_pow(failures.min(16));
    interval.saturating_mul(factor).min(MAX_BACKOFF.max(interval))
}

/// An error with its causes (reqwest's own text omits them: "error sending
/// request" hides "connection refused").
pub fn error_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One poll of the peer at `url` (base URL, no trailing slash).
pub async fn poll_state(client: &reqwest::Client, url: &str, token: &str) -> Result<Polled, String> {
    let response = client
        .get(format!("{url}/internal/state"))
        .header(CLUSTER_TOKEN_HEADER, token)
        .timeout(POLL_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("poll failed: {}", error_text(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("poll answered {status}"));
    }
    let remote = response.remote_addr();
    let state = response.json::<WorkerState>().await.map_err(|e| format!("poll answer is not a worker state: {e}"))?;
    Ok(Polled { state, remote })
}

/// Polls each of `urls` on its own task, forever: `on_send(i)` runs as
/// each poll goes out, `on_poll(i, outcome)` when it is answered and
/// returns the peer's consecutive failures, which set the next wait.
pub fn spawn_pollers<S, F, Fut>(urls: Vec<String>, client: reqwest::Client, token: String, interval: Duration, on_send: S, on_poll: F)
where
    S: Fn(usize) + Clone + Send + Sync + 'static,
    F: Fn(usize, Result<Polled, String>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = u32> + Send,
{
    for (i, url) in urls.into_iter().enumerate() {
        let (client, token, on_send, on_poll) = (client.clone(), token.clone(), on_send.clone(), on_poll.clone());
        tokio::spawn(async move {
            loop {
                on_send(i);
                let outcome = poll_state(&client, &url, &token).await;
                let failures = on_poll(i, outcome).await;
                tokio::time::sleep(next_poll_delay(interval, failures)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(ready: bool) -> WorkerState {
        WorkerState { ready, ..Default::default() }
    }

    #[test]
    fn health_follows_polls_and_failed_calls_and_reports_only_transitions() {
        let h = PeerHealth::default();
        assert!(!h.is_healthy(), "unknown until polled");
        let mut marked = 0;
        assert_eq!(h.record_poll(Ok(ready(true)), || marked += 1), Some(Transition { healthy: true, why: "poll ok".into() }));
        assert_eq!(h.record_poll(Ok(ready(true)), || marked += 1), None, "no transition");
        assert_eq!(marked, 2, "every ready report is marked");
        assert_eq!(h.record_failure("refused").map(|t| t.healthy), Some(false));
        assert_eq!(h.record_failure("refused"), None, "already unhealthy");
        assert_eq!(h.record_poll(Err("down".into()), || unreachable!()), None);
        assert_eq!(h.failures(), 3);
        assert!(h.get().state.is_some(), "a failed poll keeps the last state");
        assert_eq!(h.record_poll(Ok(ready(false)), || unreachable!()), None);
        assert!(h.get().state.is_some_and(|s| !s.ready), "a not-ready state is kept");
        assert_eq!(h.failures(), 4);
        assert!(h.record_poll(Ok(ready(true)), || {}).is_some_and(|t| t.healthy));
        assert_eq!(h.failures(), 0);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let i = Duration::from_millis(500);
        assert_eq!(next_poll_delay(i, 0), i);
        assert_eq!(next_poll_delay(i, 1), Duration::from_secs(1));
        assert_eq!(next_poll_delay(i, 3), Duration::from_secs(4));
        assert_eq!(next_poll_delay(i, 5), MAX_BACKOFF);
        assert_eq!(next_poll_delay(i, 1000), MAX_BACKOFF);
        // An interval above the cap is kept.
        assert_eq!(next_poll_delay(Duration::from_secs(20), 2), Duration::from_secs(20));
    }
}
