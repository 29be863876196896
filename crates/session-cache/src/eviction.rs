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
    /// Of `device_blocks`, those already copied to the host tier by
    /// write-back (offloading them needs no copy and no new host slot).
    pub mirrored: usize,
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
            let action = if host_free_blocks >= c.device_blocks - c.mirrored { EvictionAction::Offload } else { EvictionAction::Drop };
            EvictionDecision { session: c.session.clone(), action, score, reason }
        })
        .max_by(|a, b| a.score.total_cmp(&b.score).then_with(|| b.session.cmp(&a.session)))
}

/// What write-back does in a step ([`decide_write_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBack {
    /// Copy up to this many idle-session blocks to the host tier now,
    /// keeping them on the device.
    Copy(usize),
    Skip(WriteBackSkip),
}

/// Why write-back copies nothing in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBackSkip {
    /// No watermark (or no host tier).
    Disabled,
    /// Free blocks plus idle blocks already on the host cover the watermark.
    AboveWatermark,
    /// The last batch of copies is still running.
    CopiesRunning,
    /// No free host slot.
    HostFull,
    /// Every idle session's device blocks are on the host already.
    NothingIdle,
}

impl WriteBackSkip {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteBackSkip::Disabled => "disabled",
            WriteBackSkip::AboveWatermark => "above_watermark",
            WriteBackSkip::CopiesRunning => "copies_running",
            WriteBackSkip::HostFull => "host_full",
            WriteBackSkip::NothingIdle => "nothing_idle",
        }
    }
}

/// The state a write-back decision is judged on, in blocks.
#[derive(Debug, Clone, Copy)]
pub struct WriteBackInputs {
    pub free: usize,
    /// Idle sessions' device blocks already copied (free at no cost).
    pub mirrored_idle: usize,
    /// Idle sessions' device blocks not yet copied.
    pub unmirrored_idle: usize,
    pub watermark: usize,
    pub host_free: usize,
    pub copies_running: bool,
    /// Most blocks one batch copies.
    pub max_batch: usize,
}

/// Write-back ahead of pressure: when the blocks that could be had at no
/// cost (free, or idle and already on the host) fall under the watermark,
/// copy idle sessions' blocks to the host tier while they stay on the
/// device, one batch at a time, so that a later eviction frees them without
/// a copy on any request's critical path.
pub fn decide_write_back(i: &WriteBackInputs) -> WriteBack {
    let cheap = i.free + i.mirrored_idle;
    if i.watermark == 0 {
        WriteBack::Skip(WriteBackSkip::Disabled)
    } else if cheap >= i.watermark {
        WriteBack::Skip(WriteBackSkip::AboveWatermark)
    } else if i.unmirrored_idle == 0 {
        WriteBack::Skip(WriteBackSkip::NothingIdle)
    } else if i.host_free == 0 {
        WriteBack::Skip(WriteBackSkip::HostFull)
    } else if i.copies_running {
        WriteBack::Skip(WriteBackSkip::CopiesRunning)
    } else {
        WriteBack::Copy((i.watermark - cheap).min(i.unmirrored_idle).min(i.host_free).min(i.max_batch.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str, idle_s: f64, blocks: usize, turns: u32) -> VictimCandidate {
        VictimCandidate { session: s.into(), idle_s, device_blocks: blocks, turns, mirrored: 0 }
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

    #[test]
    fn mirrored_blocks_need_no_host_room_to_offload() {
        let mut cand = c("a", 5.0, 10, 1);
        cand.mirrored = 8;
        assert_eq!(choose_victim(&[cand], 2, 100).unwrap().action, EvictionAction::Offload);
    }

    #[test]
    fn write_back_copies_what_the_watermark_lacks_one_batch_at_a_time() {
        let i = WriteBackInputs {
            free: 10,
            mirrored_idle: 5,
            unmirrored_idle: 100,
            watermark: 40,
            host_free: 1000,
            copies_running: false,
            max_batch: 64,
        };
        assert_eq!(decide_write_back(&i), WriteBack::Copy(25));
        assert_eq!(decide_write_back(&WriteBackInputs { max_batch: 8, ..i }), WriteBack::Copy(8));
        assert_eq!(decide_write_back(&WriteBackInputs { host_free: 3, ..i }), WriteBack::Copy(3));
        assert_eq!(decide_write_back(&WriteBackInputs { unmirrored_idle: 2, ..i }), WriteBack::Copy(2));
        let skip = |w| WriteBack::Skip(w);
        assert_eq!(decide_write_back(&WriteBackInputs { watermark: 0, ..i }), skip(WriteBackSkip::Disabled));
        assert_eq!(decide_write_back(&WriteBackInputs { free: 35, ..i }), skip(WriteBackSkip::AboveWatermark));
        assert_eq!(decide_write_back(&WriteBackInputs { copies_running: true, ..i }), skip(WriteBackSkip::CopiesRunning));
        assert_eq!(decide_write_back(&WriteBackInputs { host_free: 0, ..i }), skip(WriteBackSkip::HostFull));
        assert_eq!(decide_write_back(&WriteBackInputs { unmirrored_idle: 0, ..i }), skip(WriteBackSkip::NothingIdle));
    }
}
