//! Which worker served each session's last turn (its "home"), keyed by the
//! exact session id. Placing a session elsewhere is a session move.
//!
//! The table also bridges the gap between a turn and the next poll: right
//! after a turn the polled state may not list the session yet, so until a
//! poll newer than the turn arrives, the home is credited with the turn's
//! estimated prompt tokens ([`resident_hint`]).
//!
//! Entries idle for [`FORGET_AFTER`] are dropped (workers expire idle
//! sessions after `--session-ttl-s`, 600 s by default).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the router remembers an idle session's home.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Home {
    /// Index of the worker.
    pub worker: usize,
    /// Estimated tokens of the session after its last turn (prompt +
    /// `max_tokens`: an upper bound, used only until the next poll).
    pub tokens: usize,
    /// When the last turn was placed or finished.
    pub at: Instant,
}

#[derive(Debug, Default)]
pub struct SessionHomes {
    map: Mutex<HashMap<String, Home>>,
}

impl SessionHomes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Home>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, session: &str) -> Option<Home> {
        self.lock().get(session).copied()
    }

    /// Records that `worker` serves `session` now; returns the previous home.
    pub fn set(&self, session: &str, worker: usize, tokens: usize) -> Option<Home> {
        self.lock().insert(session.to_string(), Home { worker, tokens, at: Instant::now() })
    }

    /// The turn on the session's home finished now.
    pub fn touch(&self, session: &str, worker: usize) {
        if let Some(h) = self.lock().get_mut(session).filter(|h| h.worker == worker) {
            h.at = Instant::now();
        }
    }

    pub fn forget(&self, session: &str) -> Option<Home> {
        self.lock().remove(session)
    }

    /// Drops homes idle for longer than `idle`.
    pub fn prune(&self, idle: Duration) -> usize {
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, h| h.at.elapsed() <= idle);
        before - map.len()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The session's tokens to credit on `worker` when its last poll is older
/// than the session's last turn there.
pub fn resident_hint(home: Option<&Home>, worker: usize, polled_at: Option<Instant>) -> usize {
    match home {
        Some(h) if h.worker == worker && polled_at.is_none_or(|p| p <= h.at) => h.tokens,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_are_kept_per_exact_session_id() {
        let homes = SessionHomes::default();
        assert_eq!(homes.set("session-1", 0, 100), None);
        assert_eq!(homes.get("session-12"), None);
        assert_eq!(homes.set("session-1", 1, 120).map(|h| h.worker), Some(0));
        assert_eq!(homes.get("session-1").map(|h| (h.worker, h.tokens)), Some((1, 120)));
        assert_eq!(homes.prune(Duration::from_secs(60)), 0);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(homes.prune(Duration::from_millis(1)), 1);
        assert!(homes.is_empty());
    }

    #[test]
    fn the_hint_covers_only_a_poll_older_than_the_turn() {
        let poll = Instant::now();
        let home = Home { worker: 1, tokens: 80, at: poll + Duration::from_millis(5) };
        assert_eq!(resident_hint(Some(&home), 1, Some(poll)), 80);
        assert_eq!(resident_hint(Some(&home), 1, None), 80);
        assert_eq!(resident_hint(Some(&home), 0, Some(poll)), 0, "another worker");
        assert_eq!(resident_hint(Some(&home), 1, Some(poll + Duration::from_millis(6))), 0, "a newer poll is the truth");
        assert_eq!(resident_hint(None, 1, None), 0);
    }
}
