//! Whether a new session of an API key makes room under
//! `--max-sessions-per-key` by dropping that key's least recently used idle
//! session, by [`decide_session_cap`]. Counted as
//! `kvc_sessions_capped_total` (the drops) and
//! `kvc_decisions_total{decision="session_cap"}`.

use std::time::Instant;

use crate::decision::{Decision, Reason};

/// One of the key's sessions.
#[derive(Debug, Clone, Copy)]
pub struct SessionCapCandidate {
    /// Not serving a request now.
    pub idle: bool,
    pub last_use: Instant,
}

crate::decision::reasons! {
    /// Why [`decide_session_cap`] dropped a session or kept them all.
    pub enum SessionCapReason in "session_cap" {
        /// No cap is set.
        NoCap("no_cap") => "keep",
        /// The key holds fewer sessions than the cap.
        UnderCap("under_cap") => "keep",
        /// The key is at its cap: its least recently used idle session goes.
        AtCap("at_cap") => "drop",
        /// The key is at its cap and every session of it is busy: the cap is
        /// exceeded until one ends.
        AllBusy("all_busy") => "keep",
    }
}

/// The victim (an index into `sessions`, the key's sessions; None: none
/// dropped) and the decision, for a key with `cap` sessions at most (0:
/// no cap).
pub fn decide_session_cap(cap: usize, sessions: &[SessionCapCandidate]) -> (Option<usize>, Decision<SessionCapReason>) {
    let victim = (0..sessions.len()).filter(|&i| sessions[i].idle).min_by_key(|&i| sessions[i].last_use);
    let (victim, reason) = if cap == 0 {
        (None, SessionCapReason::NoCap)
    } else if sessions.len() < cap {
        (None, SessionCapReason::UnderCap)
    } else if victim.is_none() {
        (None, SessionCapReason::AllBusy)
    } else {
        (victim, SessionCapReason::AtCap)
    };
    let d = Decision::new(reason.outcomes()[0], reason).term("sessions", sessions.len() as f64).term("cap", cap as f64);
    (victim, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_key_at_its_cap_loses_its_least_recently_used_idle_session() {
        let t = Instant::now();
        let c = |idle, age: u64| SessionCapCandidate { idle, last_use: t - Duration::from_secs(age) };
        let three = [c(true, 5), c(false, 50), c(true, 9)];
        let reason = |cap, s: &[SessionCapCandidate]| {
            let (v, d) = decide_session_cap(cap, s);
            (v, d.reason)
        };
        assert_eq!(reason(3, &three), (Some(2), SessionCapReason::AtCap));
        assert_eq!(reason(2, &three), (Some(2), SessionCapReason::AtCap));
        assert_eq!(reason(4, &three), (None, SessionCapReason::UnderCap));
        assert_eq!(reason(0, &three), (None, SessionCapReason::NoCap));
        assert_eq!(reason(1, &[c(false, 1)]), (None, SessionCapReason::AllBusy));
        assert_eq!(decide_session_cap(3, &three).1.outcome, "drop");
    }
}
