//! Polling peers' published state (`GET /internal/state`), shared by the
//! router (its workers) and the decode worker (its prefill workers): one
//! poll deadline, one backoff, the cluster token on every call.
//!
//! Each peer has its own task: it polls every `interval` while the peer
//! answers, and after consecutive failures waits `interval x 2^failures`,
//! at most [`MAX_BACKOFF`]. What a poll means (health, load corrections) is
//! the caller's: it gets each outcome through a callback.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use kvc_disagg::protocol::WorkerState;

use crate::auth::CLUSTER_TOKEN_HEADER;

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
