//! Progress of long start-up work (downloads, weight loading): a bar per
//! item when stderr is a terminal (indicatif), plain log lines otherwise
//! (at most one every [`LOG_EVERY`], and one when the item is done, with
//! the time it took and its rate), so that a log collector sees the same
//! facts an operator sees on a terminal.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Interval between two log lines of one item when stderr is no terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// One item's progress in bytes.
pub struct Progress {
    what: &'static str,
    item: String,
    total: u64,
    done: u64,
    /// Bytes already there when the item started (a resumed download):
    /// counted in `done`, not in the rate.
    resumed: u64,
    started: Instant,
    next_log: Instant,
    bar: Option<ProgressBar>,
}

/// What a finished item took.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Finished {
    /// Bytes moved per second, in GB/s (10^9).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

impl Progress {
    /// `what` names the activity ("download", "load weights"), `item` the
    /// file or part; `total` bytes, `resumed` of them already done.
    pub fn start(what: &'static str, item: impl Into<String>, total: u64, resumed: u64) -> Self {
        let item = item.into();
        let bar = std::io::stderr().is_terminal().then(|| {
            // Set up hidden, then shown: no frame without its name.
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
            let style = ProgressStyle::with_template(
                "{prefix} {msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(what);
            bar.set_message(item.clone());
            bar.set_position(resumed);
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar
        });
        let now = Instant::now();
        if bar.is_none() {
            tracing::info!(what, item = %item, total_bytes = total, resumed_bytes = resumed, "{what}: {item} started");
        }
        Self { what, item, total, done: resumed, resumed, started: now, next_log: now + LOG_EVERY, bar }
    }

    pub fn inc(&mut self, bytes: u64) {
        self.done += bytes;
        match &self.bar {
            Some(bar) => bar.set_position(self.done),
            None if Instant::now() >= self.next_log => {
                self.next_log = Instant::now() + LOG_EVERY;
                let percent = if self.total > 0 { 100.0 * self.done as f64 / self.total as f64 } else { 100.0 };
                tracing::info!(
                    what = self.what, item = %self.item, done_bytes = self.done, total_bytes = self.total,
                    percent = %format!("{percent:.1}"), "{}: {} {percent:.1} %", self.what, self.item
                );
            }
            None => {}
        }
    }

    /// Ends the item and logs what it took (bytes done in this run, time, GB/s).
    pub fn finish(self) -> Finished {
        let finished = Finished { bytes: self.done - self.resumed, elapsed: self.started.elapsed() };
        if let Some(bar) = &self.bar {
            // The summary line below is the lasting record.
            bar.finish_and_clear();
        }
        tracing::info!(
            what = self.what, item = %self.item, bytes = finished.bytes, seconds = %format!("{:.3}", finished.elapsed.as_secs_f64()),
            gb_per_s = %format!("{:.3}", finished.gb_per_s()), "{}: {} done", self.what, self.item
        );
        finished
    }

    /// Ends the item without the summary (it failed; the error says why).
    pub fn abandon(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
