//! The one cost function that picks which idle session loses device blocks.

use serde::Serialize;

/// What the policy knows about one idle session.
#[derive(Debug, Clone)]
pub struct VictimCandidate {
    pub session: String,
    /// Seconds since the session's last turn ended.
    pub idle_s: f64,
    /// Device blocks that eviction would actually free (not shared with running requests).
    pub device_blocks: usize,
    /// Turns the session has completed (more turns: more likely to return).
    pub turns: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionAction {
    /// Copy to the host tier, free the device blocks.
    Offload,
    /// Free without a copy (host tier full or disabled).
    Drop,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvictionDecision {
    pub session: String,
    pub action: EvictionAction,
    pub score: f64,
    /// The dominant term: "idle", "size" or "few_turns".
    pub reason: &'static str,
}

/// Expected cost of losing a session's device KV is low when it has been
/// idle for long (it may not come back soon), when it is large (freeing it
/// helps most) and when it has had few turns (agent sessions that have run
/// many turns keep coming back). Score = idle term + size term + turn term;
/// the highest score is evicted.
pub fn choose_victim(candidates: &[VictimCandidate], host_free_blocks: usize, pool_blocks: usize) -> Option<EvictionDecision> {
    let pool = pool_blocks.max(1) as f64;
    candidates
        .iter()
        .filter(|c| c.device_blocks > 0)
        .map(|c| {
            let idle = (c.idle_s / 10.0).min(10.0);
            let size = c.device_blocks as f64 / pool * 2.0;
            let few_turns = 1.0 / (1.0 + c.turns as f64);
            let score = idle + size + few_turns;
            let reason = if idle >= size && idle >= few_turns {
                "idle"
            } else if size >= few_turns {
                "size"
            } else {
                "few_turns"
            };
            let action = if host_free_blocks >= c.device_blocks { EvictionAction::Offload } else { EvictionAction::Drop };
            EvictionDecision { session: c.session.clone(), action, score, reason }
        })
        .max_by(|a, b| a.score.total_cmp(&b.score).then_with(|| b.session.cmp(&a.session)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str, idle_s: f64, blocks: usize, turns: u32) -> VictimCandidate {
        VictimCandidate { session: s.into(), idle_s, device_blocks: blocks, turns }
    }

    #[test]
    fn the_longest_idle_session_goes_first() {
        let d = choose_victim(&[c("a", 1.0, 10, 3), c("b", 60.0, 10, 3)], 100, 100).unwrap();
        assert_eq!((d.session.as_str(), d.reason), ("b", "idle"));
        assert_eq!(d.action, EvictionAction::Offload);
    }

    #[test]
    fn without_host_room_the_victim_is_dropped() {
        let d = choose_victim(&[c("a", 5.0, 10, 1)], 3, 100).unwrap();
        assert_eq!(d.action, EvictionAction::Drop);
    }

    #[test]
    fn sessions_with_nothing_to_free_are_never_chosen() {
        assert!(choose_victim(&[c("a", 100.0, 0, 0)], 10, 10).is_none());
    }
}
