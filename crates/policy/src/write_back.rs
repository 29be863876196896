//! Whether the session cache copies idle sessions' device blocks to the
//! host tier ahead of pressure in a step, and how many, by
//! [`decide_write_back`] (whose blocks: [`crate::eviction::decide_eviction`]).
//! The cheap checks come first, by [`write_back_gate`], so that the common
//! step (above the watermark, or a batch still copying) is decided without
//! a pass over the sessions. Counted as
//! `kvc_decisions_total{decision="write_back"}` ([`WriteBackReason`]); the
//! blocks copied, used and discarded are
//! `kvc_host_tier_write_back_blocks_total{outcome}`.

/// What write-back does in a step ([`decide_write_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBack {
    /// Copy up to this many idle-session blocks to the host tier now,
    /// keeping them on the device.
    Copy(usize),
    Skip(WriteBackSkip),
}

crate::decision::reasons! {
    /// Why write-back copies nothing in a step.
    pub enum WriteBackSkip {
        /// No watermark (or no host tier).
        Disabled("disabled"),
        /// Free blocks plus idle blocks already on the host cover the watermark.
        AboveWatermark("above_watermark"),
        /// The last batch of copies is still running.
        CopiesRunning("copies_running"),
        /// No free host slot.
        HostFull("host_full"),
        /// Every idle session's device blocks are on the host already.
        NothingIdle("nothing_idle"),
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

/// What write-back knows before a pass over the sessions.
#[derive(Debug, Clone, Copy)]
pub struct WriteBackGate {
    pub watermark: usize,
    /// Slots of the host tier (0: none).
    pub host_capacity: usize,
    /// Its copies run beside the compute work (a GPU pool's pinned arena):
    /// where copies happen when asked for, copying ahead saves nothing.
    pub host_asynchronous: bool,
    pub free: usize,
    pub copies_running: bool,
}

/// The decision without a pass over the sessions, when the cheap facts
/// settle it (None: gather [`WriteBackInputs`] and [`decide_write_back`]).
pub fn write_back_gate(g: &WriteBackGate) -> Option<WriteBackSkip> {
    if g.watermark == 0 || g.host_capacity == 0 || !g.host_asynchronous {
        Some(WriteBackSkip::Disabled)
    } else if g.free >= g.watermark {
        Some(WriteBackSkip::AboveWatermark)
    } else if g.copies_running {
        // Nothing to decide until the batch in flight is done.
        Some(WriteBackSkip::CopiesRunning)
    } else {
        None
    }
}

/// Why write-back copies (or not): the reasons of
/// `kvc_decisions_total{decision="write_back"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteBackReason {
    /// The blocks to be had at no cost are under the watermark: copy.
    BelowWatermark,
    Skip(WriteBackSkip),
}

impl WriteBackReason {
    pub const ALL: [WriteBackReason; 6] = [
        WriteBackReason::BelowWatermark,
        WriteBackReason::Skip(WriteBackSkip::Disabled),
        WriteBackReason::Skip(WriteBackSkip::AboveWatermark),
        WriteBackReason::Skip(WriteBackSkip::CopiesRunning),
        WriteBackReason::Skip(WriteBackSkip::HostFull),
        WriteBackReason::Skip(WriteBackSkip::NothingIdle),
    ];
}

impl crate::decision::Reason for WriteBackReason {
    const DECISION: &'static str = "write_back";
    const ALL: &'static [Self] = &Self::ALL;
    fn label(self) -> &'static str {
        match self {
            WriteBackReason::BelowWatermark => "below_watermark",
            WriteBackReason::Skip(s) => s.as_str(),
        }
    }
    fn outcomes(self) -> &'static [&'static str] {
        match self {
            WriteBackReason::BelowWatermark => &["copy"],
            WriteBackReason::Skip(_) => &["skip"],
        }
    }
}

impl WriteBack {
    /// As a decision; a copy's term is the blocks it copies.
    pub fn decision(&self) -> crate::decision::Decision<WriteBackReason> {
        use crate::decision::Decision;
        match *self {
            WriteBack::Copy(n) => Decision::new("copy", WriteBackReason::BelowWatermark).term("blocks", n as f64),
            WriteBack::Skip(s) => Decision::new("skip", WriteBackReason::Skip(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn inputs() -> WriteBackInputs {
        WriteBackInputs {
            free: 10,
            mirrored_idle: 5,
            unmirrored_idle: 100,
            watermark: 40,
            host_free: 1000,
            copies_running: false,
            max_batch: 64,
        }
    }

    #[test]
    fn write_back_copies_what_the_watermark_lacks_one_batch_at_a_time() {
        let i = inputs();
        assert_eq!(decide_write_back(&i), WriteBack::Copy(25));
        assert_eq!(decide_write_back(&WriteBackInputs { max_batch: 8, ..i }), WriteBack::Copy(8));
        assert_eq!(decide_write_back(&WriteBackInputs { max_batch: 0, ..i }), WriteBack::Copy(1));
        assert_eq!(decide_write_back(&WriteBackInputs { host_free: 3, ..i }), WriteBack::Copy(3));
        assert_eq!(decide_write_back(&WriteBackInputs { unmirrored_idle: 2, ..i }), WriteBack::Copy(2));
        let skip = |w| WriteBack::Skip(w);
        assert_eq!(decide_write_back(&WriteBackInputs { watermark: 0, ..i }), skip(WriteBackSkip::Disabled));
        assert_eq!(decide_write_back(&WriteBackInputs { free: 35, ..i }), skip(WriteBackSkip::AboveWatermark));
        assert_eq!(decide_write_back(&WriteBackInputs { copies_running: true, ..i }), skip(WriteBackSkip::CopiesRunning));
        assert_eq!(decide_write_back(&WriteBackInputs { host_free: 0, ..i }), skip(WriteBackSkip::HostFull));
        assert_eq!(decide_write_back(&WriteBackInputs { unmirrored_idle: 0, ..i }), skip(WriteBackSkip::NothingIdle));
    }

    /// Every skip reason and a copy are reached over a grid, a copy is
    /// never more than the watermark lacks, and the labels are today's.
    #[test]
    fn every_reason_is_reachable_with_todays_labels() {
        let mut skips = HashSet::new();
        let mut copied = false;
        for watermark in [0, 40] {
            for free in [0, 10, 40] {
                for unmirrored_idle in [0, 100] {
                    for host_free in [0, 1000] {
                        for copies_running in [false, true] {
                            let i = WriteBackInputs { watermark, free, unmirrored_idle, host_free, copies_running, ..inputs() };
                            match decide_write_back(&i) {
                                WriteBack::Skip(s) => {
                                    skips.insert(s);
                                }
                                WriteBack::Copy(n) => {
                                    assert!(n >= 1 && n <= watermark - free - i.mirrored_idle, "{i:?} -> {n}");
                                    copied = true;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(copied);
        assert_eq!(skips, HashSet::from(WriteBackSkip::ALL));
        let labels: Vec<_> = WriteBackSkip::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(labels, ["disabled", "above_watermark", "copies_running", "host_full", "nothing_idle"]);
    }

    #[test]
    fn the_gate_settles_the_cheap_cases_without_the_sessions() {
        let g = WriteBackGate { watermark: 40, host_capacity: 100, host_asynchronous: true, free: 10, copies_running: false };
        assert_eq!(write_back_gate(&g), None);
        assert_eq!(write_back_gate(&WriteBackGate { watermark: 0, ..g }), Some(WriteBackSkip::Disabled));
        assert_eq!(write_back_gate(&WriteBackGate { host_capacity: 0, ..g }), Some(WriteBackSkip::Disabled));
        assert_eq!(write_back_gate(&WriteBackGate { host_asynchronous: false, ..g }), Some(WriteBackSkip::Disabled));
        assert_eq!(write_back_gate(&WriteBackGate { free: 40, ..g }), Some(WriteBackSkip::AboveWatermark));
        assert_eq!(write_back_gate(&WriteBackGate { copies_running: true, ..g }), Some(WriteBackSkip::CopiesRunning));
        assert_eq!(WriteBack::Copy(3).decision().outcome, "copy");
        assert_eq!(WriteBack::Skip(WriteBackSkip::HostFull).decision().reason, WriteBackReason::Skip(WriteBackSkip::HostFull));
    }
}
