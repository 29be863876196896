//! Host-memory tier: whole blocks (every layer's K and V) copied out of the
//! pool, bounded in blocks.

use kvc_kv_pool::{BlockId, KvStorage};

pub type HostBlockId = u32;

pub struct HostTier {
    slots: Vec<Option<Vec<u8>>>,
    free: Vec<HostBlockId>,
}

impl HostTier {
    pub fn new(capacity_blocks: usize) -> Self {
        Self { slots: vec![None; capacity_blocks], free: (0..capacity_blocks as HostBlockId).rev().collect() }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Copies a device block into the tier; None when the tier is full.
    pub fn store(&mut self, storage: &KvStorage, block: BlockId) -> Option<HostBlockId> {
        let slot = self.free.pop()?;
        let layers = storage.layout().num_layers;
        let mut bytes = Vec::with_capacity(storage.layout().bytes_per_block());
        for layer in 0..layers {
            bytes.extend_from_slice(storage.block_bytes(layer, block));
        }
        self.slots[slot as usize] = Some(bytes);
        Some(slot)
    }

    /// Copies a stored block back into device block `dst` and frees the slot.
    pub fn restore(&mut self, storage: &mut KvStorage, slot: HostBlockId, dst: BlockId) {
        let bytes = self.slots[slot as usize].take().expect("restoring an occupied host slot");
        let per_layer = storage.layout().layer_block_bytes();
        for (layer, chunk) in bytes.chunks_exact(per_layer).enumerate() {
            storage.set_block_bytes(layer, dst, chunk).expect("host block has the pool's layout");
        }
        self.free.push(slot);
    }

    pub fn release(&mut self, slot: HostBlockId) {
        if self.slots[slot as usize].take().is_some() {
            self.free.push(slot);
        }
    }
}
