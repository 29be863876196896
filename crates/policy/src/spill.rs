//! How a prefill worker's snapshot store makes room on the device: demote
//! its least recently used entry to the host tier, drop the coldest
//! host-resident entry to make host room, or drop the victim
//! ([`decide_spill`]). Counted as
//! `kvc_decisions_total{decision="spill"}` (the action its outcome), every pair of
//! [`SpillReason::pairs`] exported at 0.

/// What the store knows when it must free device blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillInputs {
    /// Device blocks of the least recently used entry that has any (the victim).
    pub victim_device_blocks: usize,
    pub victim_last_use: u64,
    pub host_free: usize,
    pub host_capacity: usize,
    /// The store's least recently used other entry with host blocks: its
    /// last use (None: no such entry).
    pub coldest_host_last_use: Option<u64>,
}

crate::decision::reasons! {
    /// How the store makes room: the `outcome` label.
    pub enum SpillAction {
        /// Copy the victim's device blocks to host slots and free them.
        Demote("demote"),
        /// Drop the coldest host-resident entry (colder than the victim) to
        /// make host room; the victim is decided again.
        DropHostEntry("drop_host_entry"),
        /// Drop the victim's KV (every tier).
        Drop("drop"),
    }
}

crate::decision::reasons! {
    /// Why [`decide_spill`] decided as it did.
    pub enum SpillReason in "spill" {
        /// The host tier has room for the victim's blocks.
        HostRoom("host_room"),
        /// The host tier is full, and an entry colder than the victim holds
        /// some of it.
        HostFull("host_full"),
        /// No host tier.
        NoHostTier("no_host_tier"),
        /// The victim has more blocks than the whole host tier.
        LargerThanHost("larger_than_host"),
        /// The host tier is full of entries newer than the victim (or of the
        /// session cache's KV).
        HostHeldByNewer("host_held_by_newer"),
    }
    outcome: SpillAction = |r| r.action()
}

impl SpillReason {
    /// The action a decision with this reason takes.
    pub fn action(self) -> SpillAction {
        match self {
            SpillReason::HostRoom => SpillAction::Demote,
            SpillReason::HostFull => SpillAction::DropHostEntry,
            SpillReason::NoHostTier | SpillReason::LargerThanHost | SpillReason::HostHeldByNewer => SpillAction::Drop,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillDecision {
    pub action: SpillAction,
    pub reason: SpillReason,
}

/// Least recently used first, across tiers: the victim goes to the host
/// tier while it has room; otherwise host KV colder than the victim is
/// dropped first, and the victim itself when nothing colder holds host room.
pub fn decide_spill(i: &SpillInputs) -> SpillDecision {
    let reason = if i.host_capacity == 0 {
        SpillReason::NoHostTier
    } else if i.host_free >= i.victim_device_blocks {
        SpillReason::HostRoom
    } else if i.victim_device_blocks > i.host_capacity {
        SpillReason::LargerThanHost
    } else {
        match i.coldest_host_last_use {
            Some(t) if t < i.victim_last_use => SpillReason::HostFull,
            _ => SpillReason::HostHeldByNewer,
        }
    };
    SpillDecision { action: reason.action(), reason }
}

impl SpillDecision {
    pub fn decision(&self) -> crate::decision::Decision<SpillReason> {
        crate::decision::Decision::new(self.action.as_str(), self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn inputs(victim: usize, host_free: usize, host_capacity: usize, coldest: Option<u64>) -> SpillInputs {
        SpillInputs { victim_device_blocks: victim, victim_last_use: 10, host_free, host_capacity, coldest_host_last_use: coldest }
    }

    #[test]
    fn the_victim_is_demoted_while_the_host_tier_has_room() {
        let d = decide_spill(&inputs(4, 4, 8, None));
        assert_eq!((d.action, d.reason), (SpillAction::Demote, SpillReason::HostRoom));
    }

    #[test]
    fn a_full_host_tier_drops_colder_host_entries_first_then_the_victim() {
        let d = decide_spill(&inputs(4, 2, 8, Some(3)));
        assert_eq!((d.action, d.reason), (SpillAction::DropHostEntry, SpillReason::HostFull));
        // Host entries newer than the victim (or none of ours) stay.
        assert_eq!(decide_spill(&inputs(4, 2, 8, Some(20))).reason, SpillReason::HostHeldByNewer);
        assert_eq!(decide_spill(&inputs(4, 2, 8, None)).action, SpillAction::Drop);
    }

    #[test]
    fn without_a_usable_host_tier_the_victim_is_dropped() {
        assert_eq!(decide_spill(&inputs(4, 0, 0, None)).reason, SpillReason::NoHostTier);
        assert_eq!(decide_spill(&inputs(9, 2, 8, Some(1))).reason, SpillReason::LargerThanHost);
    }

    #[test]
    fn every_pair_is_reachable_and_decisions_stay_in_the_table_with_todays_labels() {
        let table: HashSet<_> = SpillReason::pairs().collect();
        let mut reached = HashSet::new();
        for victim in 0..6 {
            for host_free in 0..6 {
                for cap in 0..6 {
                    for coldest in [None, Some(0), Some(10), Some(20)] {
                        let d = decide_spill(&inputs(victim, host_free.min(cap), cap, coldest));
                        assert!(table.contains(&(d.action, d.reason)), "{d:?} outside the label table");
                        reached.insert((d.action, d.reason));
                    }
                }
            }
        }
        assert_eq!(reached, table);
        let labels: Vec<_> = SpillReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["host_room", "host_full", "no_host_tier", "larger_than_host", "host_held_by_newer"]);
        let actions: HashSet<_> = SpillReason::pairs().map(|(a, _)| a.as_str()).collect();
        assert_eq!(actions, HashSet::from(["demote", "drop_host_entry", "drop"]));
    }
}
