//! Moving KV blocks from the local pool into a peer's pool.
//!
//! [`KvTransport`] is the interface the rest of kvc programs against;
//! [`MooncakeTransport`] implements it over the Mooncake Transfer Engine
//! (`mooncake-sys`), [`InProcessTransport`] by memcpy between pools of one
//! process (tests only). A transfer is a list of [`BlockCopy`]s (layer, source
//! block, destination block), coalesced into contiguous byte ranges
//! ([`crate::plan`]) and written into the peer's registered region at the
//! offsets its [`HandshakeRecord`] describes.

mod in_process;
mod mooncake;
mod pending;

use std::time::Duration;

use kvc_kv_pool::{KvLayout, KvStorage, MemoryRegion};

pub use in_process::InProcessTransport;
pub use mooncake::{allow_peer, host_ip, refused_connections, Listeners, MooncakeConfig, MooncakeTransport};
pub use pending::{Backoff, PendingWrite};

use crate::handshake::HandshakeRecord;
use crate::plan::BlockCopy;
use crate::{DisaggError, Result};

/// A KV transport between this worker's pool and its peers' pools.
pub trait KvTransport: Send + Sync {
    /// This pool's record, to send to peers (see [`crate::handshake::exchange`]).
    fn local_record(&self) -> &HandshakeRecord;

    /// Opens the peer described by `remote`, refusing an incompatible layout.
    fn connect(&self, remote: &HandshakeRecord) -> Result<Peer>;

    /// Writes the local blocks into the peer's blocks and waits until every
    /// byte is confirmed, or fails with a typed error within `timeout`.
    fn write_blocks(&self, peer: &Peer, copies: &[BlockCopy], timeout: Duration) -> Result<TransferReport>;

    /// Closes the peer.
    fn disconnect(&self, peer: Peer) -> Result<()>;
}

/// An opened peer.
#[derive(Debug, Clone)]
pub struct Peer {
    pub(crate) record: HandshakeRecord,
    /// Transport-specific handle (Mooncake's segment id).
    pub(crate) handle: i64,
}

impl Peer {
    pub fn record(&self) -> &HandshakeRecord {
        &self.record
    }

    /// The peer's segment name ("host:port").
    pub fn name(&self) -> &str {
        &self.record.segment
    }
}

/// What a completed transfer moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferReport {
    pub bytes: u64,
    /// Contiguous byte ranges (transfer tasks) after coalescing.
    pub ranges: usize,
    pub elapsed: Duration,
}

/// The memory of a KV pool, as a transport registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMemory {
    pub layout: KvLayout,
    pub num_blocks: usize,
    pub region: MemoryRegion,
}

impl PoolMemory {
    /// The memory of `storage`.
    ///
    /// # Safety
    ///
    /// A transport given this value lets peers write into the region at any
    /// time while it lives: `storage` must outlive every transport built
    /// from it (drop the transport first), and nothing may rely on the
    /// region's contents staying unchanged while peers may write to it.
    pub unsafe fn of_storage(storage: &KvStorage) -> Result<Self> {
        match storage.regions().as_slice() {
            [region] => Ok(Self { layout: *storage.layout(), num_blocks: storage.num_blocks(), region: *region }),
            regions => Err(DisaggError::InvalidRecord {
                field: "region_len",
                reason: format!("the pool has {} memory regions; one is supported", regions.len()),
            }),
        }
    }
}
