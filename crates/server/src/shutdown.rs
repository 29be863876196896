//! Graceful shutdown. On SIGTERM / SIGINT the listener closes (new
//! connections are refused), `/health` turns 503, and requests in flight
//! may finish for `--shutdown-timeout-s`. Then the rest are cancelled: their
//! engine requests are aborted and their clients get an error (503 JSON, or
//! a final error event in a stream). The process then exits 0.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long cancelled requests get to send their final error.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The server's phase, shared by handlers.
#[derive(Debug)]
pub struct Lifecycle {
    draining: AtomicBool,
    cancel: watch::Sender<bool>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self { draining: AtomicBool::new(false), cancel: watch::channel(false).0 }
    }
}

impl Lifecycle {
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Tells every request in flight to stop now.
    pub fn cancel_in_flight(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves once [`Lifecycle::cancel_in_flight`] was called.
    pub fn cancelled(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.cancel.subscribe();
        async move {
            if rx.wait_for(|&c| c).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Serves `app` until `signal`, then drains as described above.
pub async fn serve_until(
    listener: TcpListener,
    app: Router,
    lifecycle: std::sync::Arc<Lifecycle>,
    shutdown_timeout: Duration,
    signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let draining = lifecycle.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        signal.await;
        draining.start_draining();
        tracing::info!("shutdown signal: no new connections; waiting for requests in flight");
        let _ = stop_tx.send(());
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    tokio::select! {
        r = &mut server => return r,
        _ = stop_rx => {}
    }
    if let Ok(r) = tokio::time::timeout(shutdown_timeout, &mut server).await {
        tracing::info!("all requests finished; exiting");
        return r;
    }
    tracing::warn!(timeout_s = shutdown_timeout.as_secs(), "requests still in flight after the shutdown timeout; cancelling them");
    lifecycle.cancel_in_flight();
    match tokio::time::timeout(CANCEL_GRACE, &mut server).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("connections still open after cancelling; closing them");
            Ok(())
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancel_reaches_every_subscriber_even_late_ones() {
        let l = Lifecycle::default();
        let early = l.cancelled();
        assert!(!l.is_draining());
        l.start_draining();
        assert!(l.is_draining());
        l.cancel_in_flight();
        let late = l.cancelled();
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(early, late) }).await.expect("both resolve");
    }

    #[tokio::test]
    async fn serve_until_exits_once_idle_after_the_signal() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "hi" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let lifecycle = std::sync::Arc::new(Lifecycle::default());
        let server = tokio::spawn(serve_until(listener, app, lifecycle.clone(), Duration::from_secs(30), async {
            let _ = rx.await;
        }));
        // Serving before the signal.
        drop(tokio::net::TcpStream::connect(addr).await.unwrap());
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server).await.expect("exits promptly").unwrap().unwrap();
        assert!(lifecycle.is_draining());
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the listener should be closed");
    }
}
