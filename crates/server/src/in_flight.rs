//! What this process has sent a peer and not had answered, to correct the
//! peer's lagging reports with. Shared by the router (requests and blocks
//! per worker, [`crate::router::peers`]) and the decode worker (prompt
//! tokens per prefill worker, [`crate::pd::peers`]).
//!
//! A peer's report (`GET /internal/state`, [`crate::peer_poll`]) is as old
//! as the last poll plus one of the peer's steps. Placing work by the bare
//! report sends everything placed in that window to the peer that looked
//! idle; each send is therefore counted here from the moment it leaves
//! until its guard ([`Sent`]) drops (answer, error or cancellation alike).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One quantity in flight to one peer.
#[derive(Debug, Default)]
pub struct InFlight {
    /// Sent and not yet answered.
    now: AtomicUsize,
    /// `now` when the peer's last report was taken.
    at_report: AtomicUsize,
}

/// Counts its amount in an [`InFlight`] until dropped.
#[derive(Debug)]
pub struct Sent {
    of: Arc<InFlight>,
    amount: usize,
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.of.now.fetch_sub(self.amount, Ordering::Relaxed);
    }
}

impl InFlight {
    /// Counts `amount` until the returned guard drops.
    pub fn send(self: &Arc<Self>, amount: usize) -> Sent {
        self.now.fetch_add(amount, Ordering::Relaxed);
        Sent { of: self.clone(), amount }
    }

    /// Sent and not yet answered.
    pub fn get(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    /// The peer's report was just taken: it counts what is in flight now.
    pub fn mark_reported(&self) {
        self.at_report.store(self.get(), Ordering::Relaxed);
    }

    /// A report corrected by what changed since it was taken: what was in
    /// flight then (counted in it) replaced by what is in flight now. For
    /// what the peer keeps counting until it answers (requests, the
    /// blocks they hold), after Dynamo's predicted active blocks.
    pub fn correct(&self, reported: usize) -> usize {
        reported.saturating_sub(self.at_report.load(Ordering::Relaxed)) + self.get()
    }

    /// A report, or what is in flight if that is more. For what the peer
    /// drains before it answers (a prefill backlog shrinks as its steps
    /// compute the prompt): what was in flight at the report cannot be
    /// subtracted from it, but the peer has at least what it has not
    /// answered still to do.
    pub fn at_least(&self, reported: usize) -> usize {
        reported.max(self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_corrected_by_what_was_sent_since_and_what_was_answered() {
        let f = Arc::new(InFlight::default());
        let first = f.send(10);
        f.mark_reported();
        // The report counts `first` (and 4 from elsewhere).
        assert_eq!(f.correct(14), 14);
        let second = f.send(6);
        assert_eq!(f.correct(14), 20, "sent after the report: counted at once");
        drop(first);
        assert_eq!(f.correct(14), 10, "answered after the report: no longer counted");
        drop(second);
        assert_eq!((f.get(), f.correct(14)), (0, 4));
    }

    #[test]
    fn at_least_is_the_larger_of_report_and_unanswered() {
        let f = Arc::new(InFlight::default());
        let a = f.send(50);
        assert_eq!((f.at_least(10), f.at_least(60)), (50, 60));
        drop(a);
        assert_eq!(f.at_least(10), 10);
    }
}
