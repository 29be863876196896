//! [`KvTransport`] between pools of one process, by memcpy: for tests of
//! the layers above the transport (P/D protocol, snapshots) that need no
//! second process and no Mooncake. Same planning and validation as the
//! Mooncake transport; segments are names in a process-wide registry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{KvTransport, Peer, PoolMemory, TransferReport};
use crate::handshake::HandshakeRecord;
use crate::plan::{plan_writes, BlockCopy};
use crate::{DisaggError, Result};

/// Live in-process segments: name -> (base address, length).
fn registry() -> &'static Mutex<HashMap<String, (u64, u64)>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, (u64, u64)>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

pub struct InProcessTransport {
    local: HandshakeRecord,
}

impl InProcessTransport {
    /// Registers `memory` under a fresh segment name ("in-process:N").
    pub fn new(memory: PoolMemory) -> Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("in-process:{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let local = HandshakeRecord::describe(&memory.layout, memory.num_blocks, memory.region, name);
        local.validate()?;
        registry().lock().unwrap_or_else(|p| p.into_inner()).insert(local.segment.clone(), (local.base_addr, local.region_len));
        Ok(Self { local })
    }
}

impl Drop for InProcessTransport {
    fn drop(&mut self) {
        registry().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.local.segment);
    }
}

impl KvTransport for InProcessTransport {
    fn local_record(&self) -> &HandshakeRecord {
        &self.local
    }

    fn connect(&self, remote: &HandshakeRecord) -> Result<Peer> {
        self.local.check_compatible(remote)?;
        let live = registry().lock().unwrap_or_else(|p| p.into_inner()).get(&remote.segment).copied();
        match live {
            Some((addr, len)) if addr == remote.base_addr && len == remote.region_len => Ok(Peer { record: remote.clone(), handle: 0 }),
            _ => Err(DisaggError::Engine {
                call: "connect",
                code: -1,
                detail: format!(": no in-process segment {} with that region", remote.segment),
            }),
        }
    }

    fn write_blocks(&self, peer: &Peer, copies: &[BlockCopy], _timeout: Duration) -> Result<TransferReport> {
        let started = Instant::now();
        let plan = plan_writes(&self.local, &peer.record, copies)?;
        // Hold the registry so the destination cannot be dropped mid-copy.
        let registry = registry().lock().unwrap_or_else(|p| p.into_inner());
        if registry.get(&peer.record.segment) != Some(&(peer.record.base_addr, peer.record.region_len)) {
            return Err(DisaggError::TransferFailed {
                peer: peer.name().into(),
                task: 0,
                tasks: plan.len(),
                status: "FAILED",
                done_bytes: 0,
                total_bytes: 0,
            });
        }
        for r in &plan {
            // SAFETY: both regions are registered and alive (their
            // transports hold them; the destination's is checked above
            // under the lock), and the plan keeps every range inside them.
            unsafe {
                std::ptr::copy(
                    (self.local.base_addr + r.src_offset) as *const u8,
                    (peer.record.base_addr + r.dst_offset) as *mut u8,
                    r.len as usize,
                );
            }
        }
        Ok(TransferReport { bytes: plan.iter().map(|r| r.len).sum(), ranges: plan.len(), elapsed: started.elapsed() })
    }

    fn disconnect(&self, _peer: Peer) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;
    use kvc_kv_pool::{KvLayout, KvStorage};

    use super::*;
    use crate::loopback::{fill_pool, hash_blocks, sides};

    fn pool(num_blocks: usize, seed: u64) -> KvStorage {
        let layout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 8, block_size: 4, dtype: DType::F16 };
        let mut s = KvStorage::new(layout, num_blocks).unwrap();
        fill_pool(&mut s, seed).unwrap();
        s
    }

    fn transport(s: &KvStorage) -> InProcessTransport {
        // SAFETY: the storages outlive their transports in these tests.
        InProcessTransport::new(unsafe { PoolMemory::of_storage(s) }.unwrap()).unwrap()
    }

    #[test]
    fn blocks_arrive_byte_identical_through_the_trait() {
        let (a, b) = (pool(8, 1), pool(12, 2));
        let (ta, tb) = (transport(&a), transport(&b));
        let t: &dyn KvTransport = &ta;
        let peer = t.connect(tb.local_record()).unwrap();
        let copies = BlockCopy::all_layers(2, &[1, 2, 7], &[10, 11, 0]);
        let report = t.write_blocks(&peer, &copies, Duration::from_secs(1)).unwrap();
        assert_eq!(report.ranges, 4);
        let (src, dst) = sides(&copies);
        assert_eq!(hash_blocks(&a, &src).unwrap(), hash_blocks(&b, &dst).unwrap());
    }

    #[test]
    fn a_dropped_peer_is_refused() {
        let (a, b) = (pool(4, 1), pool(4, 2));
        let ta = transport(&a);
        let tb = transport(&b);
        let peer = ta.connect(tb.local_record()).unwrap();
        drop(tb);
        let err = ta.write_blocks(&peer, &[BlockCopy { layer: 0, src: 0, dst: 0 }], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, DisaggError::TransferFailed { .. }), "{err}");
    }
}
