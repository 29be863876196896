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

/// Limits on client connections (flags `--max-connections`,
/// `--header-read-timeout-s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once; further clients wait in the listen
    /// backlog until one closes (the process never runs out of fds).
    pub max_connections: usize,
    /// A connection must send a request's headers within this, counted
    /// from when it starts waiting for them (a new or an idle keep-alive
    /// connection): slowloris clients and idle connections are closed.
    pub header_read_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self { max_connections: default_max_connections(), header_read_timeout: Duration::from_secs(30) }
    }
}

/// File descriptors kept for everything but client connections (model
/// files, the engine, the KV transport, outgoing peer connections).
const RESERVED_FDS: usize = 256;

/// The open-files limit less [`RESERVED_FDS`], at least 16, at most 65536.
pub fn default_max_connections() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 { r.rlim_cur } else { 1024 };
    (soft.min(1 << 20) as usize).saturating_sub(RESERVED_FDS).clamp(16, 65536)
}

/// Serves `app` until `signal`, then drains as described above.
pub async fn serve_until(
    listener: TcpListener,
    app: Router,
    lifecycle: std::sync::Arc<Lifecycle>,
    shutdown_timeout: Duration,
    limits: ConnLimits,
    signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let graceful = accept_until(listener, app, limits, signal).await;
    lifecycle.start_draining();
    tracing::info!("shutdown signal: no new connections; waiting for requests in flight");
    let mut drained = std::pin::pin!(graceful.shutdown());
    if tokio::time::timeout(shutdown_timeout, &mut drained).await.is_ok() {
        tracing::info!("all requests finished; exiting");
        return Ok(());
    }
    tracing::warn!(timeout_s = shutdown_timeout.as_secs(), "requests still in flight after the shutdown timeout; cancelling them");
    lifecycle.cancel_in_flight();
    if tokio::time::timeout(CANCEL_GRACE, &mut drained).await.is_err() {
        tracing::warn!("connections still open after cancelling; closing them");
    }
    Ok(())
}

/// Accepts connections on `listener` and serves `app` on each (the
/// connection limits, protocol errors as error JSON) until `signal`; then
/// closes the listener and returns the connections still open, for the
/// caller to drain. The probes' front during a load uses it as it is.
pub async fn accept_until(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    signal: impl Future<Output = ()> + Send + 'static,
) -> hyper_util::server::graceful::GracefulShutdown {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    // HTTP/1 only: the auto-detection of HTTP/2 waits for a client's first
    // bytes with no timeout, so a silent connection would be held forever.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let mut signal = std::pin::pin!(signal);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut signal => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => (stream, peer),
                Err(e) => {
                    // Out of fds or similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut signal => break,
        };
        let _ = stream.set_nodelay(true);
        // The client's address goes with each request (axum's ConnectInfo).
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                req
            })
            .service(app.clone());
        // Protocol errors are answered as error JSON (protocol_errors.rs).
        let (io, handback) = crate::protocol_errors::ProtocolErrors::new(stream);
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service)).into_owned();
        let conn = graceful.watch(conn);
        let header_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _slot = permit;
            // The connection (and with it the socket) is dropped here, so
            // that `handback` has it.
            let ended = conn.await;
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
                let ending = crate::protocol_errors::Ending::of(&*e);
                crate::protocol_errors::answer_unanswered(ending, handback.take(), header_timeout).await;
            }
        });
    }
    drop(listener);
    graceful
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
        let server = tokio::spawn(serve_until(listener, app, lifecycle.clone(), Duration::from_secs(30), ConnLimits::default(), async {
            let _ = rx.await;
        }));
        // Serving before the signal.
        drop(tokio::net::TcpStream::connect(addr).await.unwrap());
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server).await.expect("exits promptly").unwrap().unwrap();
        assert!(lifecycle.is_draining());
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the listener should be closed");
    }

    /// Serves a one-route app with `limits` until the test ends.
    async fn limited_server(limits: ConnLimits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "hi" }));
        let lifecycle = std::sync::Arc::new(Lifecycle::default());
        tokio::spawn(serve_until(listener, app, lifecycle, Duration::from_secs(1), limits, std::future::pending()));
        addr
    }

    /// Reads until EOF (or an error, a reset); the bytes read.
    async fn read_to_end(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        out
    }

    #[tokio::test]
    async fn idle_and_slowloris_connections_are_closed_after_the_header_timeout() {
        use tokio::io::AsyncWriteExt;
        let addr = limited_server(ConnLimits { max_connections: 8, header_read_timeout: Duration::from_millis(200) }).await;
        // Silent: closed with nothing sent back.
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), read_to_end(&mut idle)).await.expect("the idle connection is closed");
        assert!(!String::from_utf8_lossy(&got).contains("200 OK"), "{got:?}");
        // Half a request, then nothing: closed too.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), read_to_end(&mut slow)).await.expect("the slow connection is closed");
        // A whole request in time is answered.
        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), read_to_end(&mut ok)).await.unwrap();
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200 OK"), "{got:?}");
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_until_one_closes() {
        use tokio::io::AsyncWriteExt;
        let addr = limited_server(ConnLimits { max_connections: 2, header_read_timeout: Duration::from_secs(60) }).await;
        let held: Vec<_> = futures::future::join_all((0..2).map(|_| tokio::net::TcpStream::connect(addr))).await;
        let mut held: Vec<_> = held.into_iter().map(Result::unwrap).collect();
        // Make sure both were accepted: each answers a request (and stays open).
        for s in &mut held {
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let mut buf = [0u8; 256];
            let n = tokio::io::AsyncReadExt::read(s, &mut buf).await.unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200 OK"));
        }
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        third.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), read_to_end(&mut third)).await;
        assert!(early.is_err(), "a third connection was served beyond the cap of 2");
        drop(held.pop());
        let got = tokio::time::timeout(Duration::from_secs(10), read_to_end(&mut third)).await.expect("served once a slot frees");
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200 OK"), "{got:?}");
    }

    #[test]
    fn the_default_cap_leaves_room_below_the_open_files_limit() {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        let cap = default_max_connections();
        assert!(
            cap >= 16 && (r.rlim_cur as usize <= RESERVED_FDS + 16 || cap + RESERVED_FDS <= r.rlim_cur as usize),
            "{cap} vs {}",
            r.rlim_cur
        );
    }
}
