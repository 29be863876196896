//! Request slots (the HTTP front's admission; the engine's KV admission probe is
//! `kvc_engine::admission`): at most `--max-concurrent-requests` generation requests run
//! at once; up to `--max-queued-requests` more wait (first come, first
//! served); beyond both the answer is 429 with `Retry-After`.
//!
//! A slot is held from admission until the response is complete (for a
//! stream: until its last event is sent or the client goes away). The wait
//! is cancellable: a queued request whose client leaves, or whose deadline
//! passes, gives its queue place back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, RETRY_AFTER_S};

#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    max_running: usize,
    max_queued: usize,
    queued: AtomicUsize,
}

/// A concurrency slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

/// Gives a queue place back when the wait ends, however it ends.
struct QueuePlace<'a>(&'a AtomicUsize);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// `max_running == 0` means no limit.
    pub fn new(max_running: usize, max_queued: usize) -> Self {
        let max_running = if max_running == 0 { Semaphore::MAX_PERMITS } else { max_running };
        Self { slots: Arc::new(Semaphore::new(max_running)), max_running, max_queued, queued: AtomicUsize::new(0) }
    }

    pub fn running(&self) -> usize {
        self.max_running - self.slots.available_permits()
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// A slot now, or after waiting in the queue, or `Busy` when the queue
    /// is full too.
    pub async fn admit(&self) -> Result<Slot, ApiError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot(permit));
        }
        let taken = self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| (q < self.max_queued).then_some(q + 1));
        if taken.is_err() {
            return Err(ApiError::Busy { running: self.running(), queued: self.queued(), retry_after_s: RETRY_AFTER_S });
        }
        let _place = QueuePlace(&self.queued);
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| ApiError::Unavailable("the server is shutting down".into()))?;
        Ok(Slot(permit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;
    use std::time::Duration;

    #[tokio::test]
    async fn requests_beyond_slots_and_queue_are_refused_with_429() {
        let a = Arc::new(Admission::new(1, 1));
        let first = a.admit().await.unwrap();
        assert_eq!(a.running(), 1);
        // The second waits in the queue.
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.admit().await.map(|_| ()) }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while a.queued() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the second request never queued");
            tokio::task::yield_now().await;
        }
        // The third finds slot and queue full.
        let err = a.admit().await.unwrap_err();
        assert_eq!(error_response(&err).0.as_u16(), 429);
        // Freeing the slot admits the waiter.
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!((a.running(), a.queued()), (0, 0));
    }

    #[tokio::test]
    async fn an_abandoned_wait_gives_its_queue_place_back() {
        let a = Admission::new(1, 1);
        let _held = a.admit().await.unwrap();
        let wait = tokio::time::timeout(Duration::from_millis(10), a.admit()).await;
        assert!(wait.is_err(), "no slot should have been free");
        assert_eq!(a.queued(), 0);
        // The queue place is free again: the next waiter is queued, not refused.
        assert!(tokio::time::timeout(Duration::from_millis(10), a.admit()).await.is_err());
    }

    #[tokio::test]
    async fn zero_slots_means_no_limit_and_zero_queue_means_no_waiting() {
        let a = Admission::new(0, 0);
        let slots: Vec<Slot> = futures::future::join_all((0..100).map(|_| a.admit())).await.into_iter().map(Result::unwrap).collect();
        assert_eq!(a.running(), 100);
        drop(slots);
        let b = Admission::new(1, 0);
        let _s = b.admit().await.unwrap();
        assert_eq!(error_response(&b.admit().await.unwrap_err()).0.as_u16(), 429);
    }
}
