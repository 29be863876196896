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
//!
//! A report is taken somewhere between the poll's send and its answer.
//! What was answered in that window was most likely still in it (the
//! peer's state is as old as its last step), so it is taken out with what
//! is in flight at the answer: a report taken mid-request but read after
//! the answer must not leave the peer looking busy until the next poll
//! (forever, if the peer has died since).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// One quantity in flight to one peer.
#[derive(Debug, Default)]
pub struct InFlight {
    /// Sent and not yet answered.
    now: AtomicUsize,
    /// What the peer's last report is taken to count.
    at_report: AtomicUsize,
    /// Answered so far (monotonic).
    answered: AtomicUsize,
    /// `answered` when the poll in progress was sent.
    answered_at_poll: AtomicUsize,
    /// A poll was sent and its report has not come.
    polling: AtomicBool,
}

/// Counts its amount in an [`InFlight`] until dropped.
#[derive(Debug)]
pub struct Sent {
    of: Arc<InFlight>,
    amount: usize,
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.of.answered.fetch_add(self.amount, Ordering::Relaxed);
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

    /// A poll of the peer is being sent.
    pub fn mark_polling(&self) {
        self.answered_at_poll.store(self.answered.load(Ordering::Relaxed), Ordering::Relaxed);
        self.polling.store(true, Ordering::Relaxed);
    }

    /// The peer's report just came: it counts what is in flight now, and
    /// what was answered since the poll was sent ([`Self::mark_polling`];
    /// without one, the report is taken as of now).
    pub fn mark_reported(&self) {
        let answered_since_poll = if self.polling.swap(false, Ordering::Relaxed) {
            self.answered.load(Ordering::Relaxed).saturating_sub(self.answered_at_poll.load(Ordering::Relaxed))
        } else {
            0
        };
        self.at_report.store(self.get() + answered_since_poll, Ordering::Relaxed);
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
    fn what_was_answered_while_the_report_was_on_its_way_is_not_counted_again() {
        let f = Arc::new(InFlight::default());
        let running = f.send(5);
        f.mark_polling();
        // The peer takes its report with the request running, then the
        // request is answered, then the report arrives.
        drop(running);
        f.mark_reported();
        assert_eq!(f.correct(5), 0, "the answered request still in the report");
        assert_eq!(f.correct(7), 2, "the rest of the report stands");
        // The next poll's window starts clean.
        f.mark_polling();
        let next = f.send(3);
        f.mark_reported();
        assert_eq!(f.correct(3), 3);
        drop(next);
        assert_eq!(f.correct(3), 0);
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
