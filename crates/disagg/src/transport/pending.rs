//! A write in flight: its tasks submitted as Mooncake batches through a
//! bounded window, and waiting for them without spinning a core.
//!
//! Window: Mooncake's TCP transport queues at most
//! `MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER` (1024) tasks per peer, parks
//! 1024 more for at most a second, and fails the rest outright. A write
//! of scattered blocks can have tens of thousands of tasks, so they go out
//! in batches of `window / 2` tasks with at most `window` in flight; the
//! next batch is submitted as soon as the oldest completes.
//!
//! Waiting: the TCP transport moves the bytes on its own threads; on a
//! small machine a busy-polling waiter competes with them for the cores.
//! The waiter polls task states, sleeping between polls with exponential
//! backoff (reset whenever a task completes), and gives up at its
//! deadline. Every batch is freed, or parked for freeing later while
//! Mooncake still holds it (see `MooncakeTransport::release_batch`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mooncake_sys as sys;

use super::{MooncakeTransport, TransferReport};
use crate::{DisaggError, Result};

/// Sleep schedule between completion polls: `first`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { first: Duration::from_micros(50), max: Duration::from_millis(2) }
    }
}

/// One submitted Mooncake batch: tasks `start..start + len` of the write.
struct Chunk {
    batch: sys::batch_id_t,
    start: usize,
    len: usize,
    /// Tasks of this batch before this one are COMPLETED.
    next: usize,
}

/// A write in flight. Dropping it unfinished releases its batches as soon
/// as Mooncake lets go of them; tasks not yet submitted are never sent.
pub struct PendingWrite<'t> {
    transport: &'t MooncakeTransport,
    peer: String,
    requests: Vec<sys::transfer_request>,
    /// Most tasks in flight at once, and tasks per batch.
    window: usize,
    chunk: usize,
    /// `requests[..submitted]` have been submitted.
    submitted: usize,
    /// Submitted batches, oldest first.
    inflight: VecDeque<Chunk>,
    done_tasks: usize,
    done_bytes: u64,
    /// An error ended the write; its batches were released.
    aborted: bool,
    total_bytes: u64,
    started: Instant,
}

impl<'t> PendingWrite<'t> {
    /// Submits the first batches of `requests`.
    pub(super) fn start(
        transport: &'t MooncakeTransport,
        peer: String,
        requests: Vec<sys::transfer_request>,
        window: usize,
        started: Instant,
    ) -> Result<Self> {
        let window = window.max(1);
        let total_bytes = requests.iter().map(|r| r.length).sum();
        let mut this = Self {
            transport,
            peer,
            requests,
            window,
            chunk: window.div_ceil(2),
            submitted: 0,
            inflight: VecDeque::new(),
            done_tasks: 0,
            done_bytes: 0,
            aborted: false,
            total_bytes,
            started,
        };
        this.refill()?;
        Ok(this)
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Bytes of the tasks confirmed complete so far (in submission order).
    pub fn done_bytes(&self) -> u64 {
        self.done_bytes
    }

    /// Transfer tasks (coalesced byte ranges) of this write.
    pub fn tasks(&self) -> usize {
        self.requests.len()
    }

    /// Advances over completed tasks and submits more as room frees up.
    /// `Ok(true)` once every task is complete (every batch is then freed);
    /// `Ok(false)` while some are outstanding; an error as soon as one
    /// failed.
    pub fn poll(&mut self) -> Result<bool> {
        if self.aborted {
            return Err(DisaggError::Aborted { peer: self.peer.clone() });
        }
        loop {
            let Some(front) = self.inflight.front() else {
                // refill() leaves nothing unsubmitted when nothing is in flight
                return Ok(true);
            };
            let (batch, start, len, mut next) = (front.batch, front.start, front.len, front.next);
            while next < len {
                match self.status(batch, next)? {
                    sys::STATUS_COMPLETED => {
                        self.done_tasks += 1;
                        self.done_bytes += self.requests[start + next].length;
                        next += 1;
                    }
                    sys::STATUS_WAITING | sys::STATUS_PENDING => break,
                    other => return Err(self.fail_task(start + next, other)),
                }
            }
            if next < len {
                self.inflight.front_mut().unwrap().next = next;
                return Ok(false);
            }
            self.inflight.pop_front();
            self.transport.release_batch(batch, len, true);
            self.refill()?;
        }
    }

    /// Waits for completion, sleeping between polls, for at most `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Result<TransferReport> {
        let backoff = self.transport.backoff();
        let deadline = Instant::now() + timeout;
        let mut pause = backoff.first;
        loop {
            let before = self.done_bytes;
            if self.poll()? {
                return Ok(TransferReport { bytes: self.total_bytes, ranges: self.requests.len(), elapsed: self.started.elapsed() });
            }
            if self.done_bytes > before {
                pause = backoff.first;
            } else if pause >= backoff.max {
                // No progress for a while: a later task may have failed
                // while the oldest one still waits.
                self.scan_for_failure()?;
            }
            let now = Instant::now();
            if now >= deadline {
                let err = DisaggError::Timeout {
                    peer: self.peer.clone(),
                    waited: self.started.elapsed(),
                    done_bytes: self.done_bytes,
                    total_bytes: self.total_bytes,
                };
                self.release_all();
                return Err(err);
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(backoff.max);
        }
    }

    /// Submits batches while the window has room.
    fn refill(&mut self) -> Result<()> {
        let mut in_flight: usize = self.inflight.iter().map(|c| c.len - c.next).sum();
        while self.submitted < self.requests.len() {
            let len = self.chunk.min(self.requests.len() - self.submitted);
            if in_flight > 0 && in_flight + len > self.window {
                break;
            }
            let start = self.submitted;
            let batch = match self.transport.submit_batch(&mut self.requests[start..start + len], &self.peer) {
                Ok(b) => b,
                Err(e) => {
                    self.release_all();
                    return Err(e);
                }
            };
            self.inflight.push_back(Chunk { batch, start, len, next: 0 });
            self.submitted += len;
            in_flight += len;
        }
        Ok(())
    }

    fn status(&mut self, batch: sys::batch_id_t, task: usize) -> Result<i32> {
        let mut st = sys::transfer_status::default();
        // SAFETY: the engine lives as long as `self.transport`; `batch` is
        // allocated and not yet freed; `task` is below its task count.
        let rc = unsafe { sys::getTransferStatus(self.transport.engine(), batch, task, &mut st) };
        if rc != 0 {
            self.release_all();
            return Err(DisaggError::Engine {
                call: "getTransferStatus",
                code: rc.into(),
                detail: format!(" for a task to {}", self.peer),
            });
        }
        Ok(st.status)
    }

    fn scan_for_failure(&mut self) -> Result<()> {
        let chunks: Vec<(sys::batch_id_t, usize, usize, usize)> = self.inflight.iter().map(|c| (c.batch, c.start, c.next, c.len)).collect();
        for (batch, start, next, len) in chunks {
            for task in next..len {
                let s = self.status(batch, task)?;
                if !matches!(s, sys::STATUS_COMPLETED | sys::STATUS_WAITING | sys::STATUS_PENDING) {
                    return Err(self.fail_task(start + task, s));
                }
            }
        }
        Ok(())
    }

    fn fail_task(&mut self, task: usize, status: i32) -> DisaggError {
        self.release_all();
        DisaggError::TransferFailed {
            peer: self.peer.clone(),
            task,
            tasks: self.requests.len(),
            status: sys::status_name(status),
            done_bytes: self.done_bytes,
            total_bytes: self.total_bytes,
        }
    }

    /// Gives every in-flight batch back and forgets the unsubmitted tasks.
    fn release_all(&mut self) {
        for c in self.inflight.drain(..) {
            self.transport.release_batch(c.batch, c.len, false);
        }
        self.submitted = self.requests.len();
        self.aborted = self.done_tasks < self.requests.len();
    }
}

impl Drop for PendingWrite<'_> {
    fn drop(&mut self) {
        self.release_all();
    }
}
