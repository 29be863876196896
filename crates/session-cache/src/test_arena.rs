//! A host arena for tests that behaves as a GPU pool's does to its callers
//! (asynchronous: batches with tickets, waits), while copying at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use kvc_kv_pool::{BlockId, CopyTicket, HostArena, HostSlot, KvStorage, VecArena};

/// Its batches are done only while `busy` is false; `waits` counts the
/// calls to [`HostArena::wait_all`].
pub(crate) struct TestArena {
    inner: VecArena,
    pub busy: Arc<AtomicBool>,
    pub waits: Arc<AtomicUsize>,
    ticket: CopyTicket,
}

impl TestArena {
    pub fn new(capacity: usize) -> Self {
        Self { inner: VecArena::new(capacity), busy: Arc::default(), waits: Arc::default(), ticket: 0 }
    }
}

impl HostArena for TestArena {
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn store(&mut self, storage: &KvStorage, block: BlockId, slot: HostSlot) {
        self.inner.store(storage, block, slot)
    }
    fn load(&mut self, storage: &mut KvStorage, slot: HostSlot, block: BlockId) {
        self.inner.load(storage, slot, block)
    }
    fn asynchronous(&self) -> bool {
        true
    }
    fn flush_async(&mut self) -> CopyTicket {
        self.ticket += 1;
        self.ticket
    }
    fn done(&mut self, _ticket: CopyTicket) -> bool {
        !self.busy.load(Ordering::Relaxed)
    }
    fn wait_all(&mut self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
    }
    fn bytes_moved(&self) -> (u64, u64) {
        self.inner.bytes_moved()
    }
}
