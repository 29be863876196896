//! Prompt tokens submitted to the step loop that its published snapshot
//! does not show yet.
//!
//! The loop drains its command channel only between steps and publishes
//! its snapshot after them, so a prompt submitted during a long step (a
//! few seconds for a long prefill chunk on a large model) was invisible to
//! [`EngineHandle::pending_prefill_tokens`](crate::EngineHandle) until the
//! step ended. Every placement decision taken in that window saw an idle
//! worker; on the GPU a burst of them all chose the same busy worker.
//!
//! The handle adds a request's prompt tokens here before sending it; the
//! loop, once it has drained the channel, publishes a snapshot that counts
//! them and only then takes them off. A reader that loads this counter
//! before the snapshot therefore never misses a submitted prompt (it may
//! count one twice for a moment, which errs towards "busy").

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::command::SubmitKv;
use crate::GenerateRequest;

#[derive(Debug, Default)]
pub(crate) struct Inbox(AtomicUsize);

impl Inbox {
    pub fn add(&self, tokens: usize) {
        self.0.fetch_add(tokens, Ordering::SeqCst);
    }

    /// Takes `tokens` off (saturating: never wraps below zero).
    pub fn remove(&self, tokens: usize) {
        let _ = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(v.saturating_sub(tokens)));
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Prompt tokens the loop may have to compute for a submission: the whole
/// prompt unless a reservation already holds some (or all, after a remote
/// prefill). Cache hits found at admission are not known here; they show
/// in the next snapshot.
pub(crate) fn tokens_to_compute(req: &GenerateRequest, kv: &SubmitKv) -> usize {
    match kv {
        SubmitKv::Reserved { first: Some(_), .. } => 0,
        SubmitKv::Reserved { computed, .. } => req.prompt_tokens.len().saturating_sub(*computed),
        SubmitKv::Compute | SubmitKv::Export => req.prompt_tokens.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_saturates() {
        let i = Inbox::default();
        i.add(5);
        i.remove(3);
        assert_eq!(i.get(), 2);
        i.remove(7);
        assert_eq!(i.get(), 0);
    }
}
