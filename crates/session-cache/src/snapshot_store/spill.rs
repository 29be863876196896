//! How [`SnapshotStore`] makes room and gets demoted KV back: the one
//! decision (demote the least recently used entry to the host tier, drop
//! the coldest host-resident entry to make host room, or drop the victim;
//! [`decide_spill`], in kvc-policy), and the moves between tiers it leads to.

use kvc_kv_pool::{BlockAllocator, KvStorage};

use super::SnapshotStore;
use crate::session::BlockLoc;

pub use kvc_policy::spill::{decide_spill, SpillAction, SpillDecision, SpillInputs, SpillReason};

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
        *self.stats.spills.entry((decision.action.as_str().to_string(), decision.reason.as_str().to_string())).or_insert(0) += 1;
        kvc_policy::log_decision(&decision.decision().term("blocks", blocks as f64));
        tracing::info!(
            event = "snapshot_spill",
            session = %target,
            action = decision.action.as_str(),
            reason = decision.reason.as_str(),
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
