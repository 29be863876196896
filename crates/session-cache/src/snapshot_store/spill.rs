//! How [`SnapshotStore`] makes room and gets demoted KV back: the one
//! decision (demote the least recently used entry to the host tier, drop
//! the coldest host-resident entry to make host room, or drop the victim),
//! and the moves between tiers it leads to.

use kvc_kv_pool::{BlockAllocator, KvStorage};
use serde::Serialize;

use super::SnapshotStore;
use crate::session::BlockLoc;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpillAction {
    /// Copy the victim's device blocks to host slots and free them.
    Demote,
    /// Drop the coldest host-resident entry (colder than the victim) to
    /// make host room; the victim is decided again.
    DropHostEntry,
    /// Drop the victim's KV (every tier).
    Drop,
}

impl SpillAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SpillAction::Demote => "demote",
            SpillAction::DropHostEntry => "drop_host_entry",
            SpillAction::Drop => "drop",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SpillDecision {
    pub action: SpillAction,
    /// `host_room`, `host_full` (make room by dropping colder host KV),
    /// `no_host_tier`, `larger_than_host`, `host_held_by_newer` (the host
    /// tier is full of newer entries or of the session cache's KV).
    pub reason: &'static str,
}

/// Least recently used first, across tiers: the victim goes to the host
/// tier while it has room; otherwise host KV colder than the victim is
/// dropped first, and the victim itself when nothing colder holds host room.
pub fn decide_spill(i: &SpillInputs) -> SpillDecision {
    let d = |action, reason| SpillDecision { action, reason };
    if i.host_capacity == 0 {
        return d(SpillAction::Drop, "no_host_tier");
    }
    if i.host_free >= i.victim_device_blocks {
        return d(SpillAction::Demote, "host_room");
    }
    if i.victim_device_blocks > i.host_capacity {
        return d(SpillAction::Drop, "larger_than_host");
    }
    match i.coldest_host_last_use {
        Some(t) if t < i.victim_last_use => d(SpillAction::DropHostEntry, "host_full"),
        _ => d(SpillAction::Drop, "host_held_by_newer"),
    }
}

impl SnapshotStore {
    /// Frees the device blocks of the least recently used entry other than
    /// `keep`'s, as [`decide_spill`] says (or host room for it). False when
    /// no entry holds device blocks. Copies are queued, not flushed.
    pub(super) fn spill_lru(&mut self, keep: Option<&str>, alloc: &mut BlockAllocator, storage: &KvStorage) -> bool {
        let others = self.entries.iter().filter(|(id, _)| Some(id.as_str()) != keep);
        let Some((victim, vlast, vdev)) = others
            .filter(|(_, e)| e.device_blocks() > 0)
            .min_by_key(|(_, e)| e.last_use)
            .map(|(id, e)| (id.clone(), e.last_use, e.device_blocks()))
        else {
            return false;
        };
        let coldest_host = self
            .entries
            .iter()
            .filter(|(id, e)| Some(id.as_str()) != keep && **id != victim && e.host_blocks() > 0)
            .min_by_key(|(_, e)| e.last_use)
            .map(|(id, e)| (id.clone(), e.last_use));
        let decision = decide_spill(&SpillInputs {
            victim_device_blocks: vdev,
            victim_last_use: vlast,
            host_free: self.host.num_free(),
            host_capacity: self.host.capacity(),
            coldest_host_last_use: coldest_host.as_ref().map(|c| c.1),
        });
        let target = match decision.action {
            SpillAction::DropHostEntry => coldest_host.expect("decided on a host entry").0,
            _ => victim,
        };
        let blocks = match decision.action {
            SpillAction::Demote => self.demote(&target, alloc, storage),
            SpillAction::DropHostEntry | SpillAction::Drop => self.drop_entry(&target, alloc),
        };
        *self.stats.spills.entry((decision.action.as_str().to_string(), decision.reason.to_string())).or_insert(0) += 1;
        tracing::info!(
            event = "snapshot_spill",
            session = %target,
            action = decision.action.as_str(),
            reason = decision.reason,
            blocks,
            host_free = self.host.num_free(),
        );
        true
    }

    /// Moves an entry's device blocks to host slots (the caller counted
    /// them free); returns how many.
    fn demote(&mut self, id: &str, alloc: &mut BlockAllocator, storage: &KvStorage) -> usize {
        let e = self.entries.get_mut(id).expect("victim exists");
        let mut n = 0;
        for loc in e.blocks.iter_mut() {
            if let BlockLoc::Device(b) = *loc {
                let h = self.host.store(storage, b).expect("counted free host slots");
                *loc = BlockLoc::Host(h);
                alloc.free(b);
                n += 1;
            }
        }
        self.used -= n;
        self.host_used += n;
        self.changed.insert(id.to_string());
        self.stats.demoted += 1;
        self.stats.demoted_blocks += n as u64;
        n
    }

    /// Drops an entry's KV in both tiers; returns its blocks.
    fn drop_entry(&mut self, id: &str, alloc: &mut BlockAllocator) -> usize {
        let e = self.entries.remove(id).expect("victim exists");
        self.changed.insert(id.to_string());
        self.stats.evicted += 1;
        self.stats.evicted_blocks += e.blocks.len() as u64;
        self.release(alloc, &e.blocks);
        e.blocks.len()
    }

    /// Brings the first `n` blocks of `id`'s entry onto the device, making
    /// room by spilling other entries. Returns how many leading blocks are
    /// on the device now (n unless the pool or the store ran out) and how
    /// many were copied back. The copies are flushed.
    pub(super) fn restore_prefix(&mut self, id: &str, n: usize, alloc: &mut BlockAllocator, storage: &mut KvStorage) -> (usize, usize) {
        let on_host = self.entries[id].blocks[..n].iter().filter(|l| matches!(l, BlockLoc::Host(_))).count();
        if on_host == 0 {
            return (n, 0);
        }
        while self.used + on_host > self.capacity || alloc.num_free() < on_host {
            if !self.spill_lru(Some(id), alloc, storage) {
                break;
            }
        }
        let mut restored = 0;
        let mut ready = n;
        for i in 0..n {
            let BlockLoc::Host(h) = self.entries[id].blocks[i] else { continue };
            let dst = match alloc.allocate(1) {
                Some(b) if self.used < self.capacity => b[0],
                got => {
                    if let Some(b) = got {
                        alloc.free_all(&b);
                    }
                    ready = i;
                    break;
                }
            };
            self.host.restore(storage, h, dst);
            self.entries.get_mut(id).expect("entry exists").blocks[i] = BlockLoc::Device(dst);
            self.used += 1;
            self.host_used -= 1;
            restored += 1;
        }
        // The restored blocks are read by the next step.
        self.host.flush();
        self.changed.insert(id.to_string());
        self.stats.restored_blocks += restored as u64;
        tracing::info!(event = "snapshot_restore", session = %id, blocks = restored, served_blocks = ready);
        (ready, restored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(victim: usize, host_free: usize, host_capacity: usize, coldest: Option<u64>) -> SpillInputs {
        SpillInputs { victim_device_blocks: victim, victim_last_use: 10, host_free, host_capacity, coldest_host_last_use: coldest }
    }

    #[test]
    fn the_victim_is_demoted_while_the_host_tier_has_room() {
        let d = decide_spill(&inputs(4, 4, 8, None));
        assert_eq!((d.action, d.reason), (SpillAction::Demote, "host_room"));
    }

    #[test]
    fn a_full_host_tier_drops_colder_host_entries_first_then_the_victim() {
        let d = decide_spill(&inputs(4, 2, 8, Some(3)));
        assert_eq!((d.action, d.reason), (SpillAction::DropHostEntry, "host_full"));
        // Host entries newer than the victim (or none of ours) stay.
        assert_eq!(decide_spill(&inputs(4, 2, 8, Some(20))).reason, "host_held_by_newer");
        assert_eq!(decide_spill(&inputs(4, 2, 8, None)).action, SpillAction::Drop);
    }

    #[test]
    fn without_a_usable_host_tier_the_victim_is_dropped() {
        assert_eq!(decide_spill(&inputs(4, 0, 0, None)).reason, "no_host_tier");
        assert_eq!(decide_spill(&inputs(9, 2, 8, Some(1))).reason, "larger_than_host");
    }
}
