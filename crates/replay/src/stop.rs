//! Why a run stopped before its workload ended, and the signals that stop
//! it. At a stop the driver sends nothing more, cuts the requests in flight
//! (each becomes a row with `cut: true`), and the report is written from
//! what was measured.

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopReason {
    /// SIGINT (Ctrl-C) or SIGTERM.
    Signal,
    /// `--duration-s` ran out.
    Duration,
}

/// Listens for SIGINT and SIGTERM from now on (the handlers are in place
/// when this returns, so a signal sent afterwards is never missed): the
/// receiver turns true at the first one. A second signal exits at once
/// (status 128 + the signal's number, as a shell reports it); the rows are
/// on disk by then, and `kvc-replay report` rebuilds the summary from
/// them. Call it inside a tokio runtime.
pub fn listen_for_signals() -> std::io::Result<watch::Receiver<bool>> {
    let (tx, rx) = watch::channel(false);
    let mut signals = Signals::new()?;
    tokio::spawn(async move {
        let (name, _) = signals.next().await;
        eprintln!("kvc-replay: {name}: stopping; writing the report of what was measured (again to quit at once)");
        let _ = tx.send(true);
        let (name, status) = signals.next().await;
        eprintln!("kvc-replay: {name} again: quitting without a report (`kvc-replay report DIR` rebuilds it from the rows)");
        std::process::exit(status);
    });
    Ok(rx)
}

/// Resolves when `rx` turns true; never when it is `None` or its sender is
/// gone without having said so.
pub async fn stopped(rx: Option<&mut watch::Receiver<bool>>) {
    if let Some(rx) = rx {
        if rx.wait_for(|s| *s).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

#[cfg(unix)]
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
    }

    /// The signal's name and the exit status it stands for.
    async fn next(&mut self) -> (&'static str, i32) {
        tokio::select! {
            _ = self.int.recv() => ("SIGINT", 130),
            _ = self.term.recv() => ("SIGTERM", 143),
        }
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    async fn next(&mut self) -> (&'static str, i32) {
        let _ = tokio::signal::ctrl_c().await;
        ("Ctrl-C", 130)
    }
}
