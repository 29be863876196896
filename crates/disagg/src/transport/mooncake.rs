//! [`KvTransport`] over the Mooncake Transfer Engine.
//!
//! Lifecycle: `new` creates an engine (P2P handshake metadata, so no
//! metadata server), installs the transport (TCP by default), and
//! registers the pool's region; `connect` opens a peer's segment; writes
//! are Mooncake batches of WRITE tasks, one per coalesced byte range;
//! `Drop` frees what is left, unregisters the region and destroys the
//! engine (which closes its listeners and threads).

use std::ffi::{c_char, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvc_kv_pool::MemoryLocation;
use mooncake_sys as sys;
use tracing::{debug, warn};

use super::pending::{Backoff, PendingWrite};
use super::{KvTransport, Peer, PoolMemory, TransferReport};
use crate::handshake::HandshakeRecord;
use crate::plan::{plan_writes, BlockCopy};
use crate::{DisaggError, Result};

#[derive(Debug, Clone)]
pub struct MooncakeConfig {
    /// Address peers reach this engine at, and the only one its listeners
    /// bind (see [`Listeners`]): an IP address or a name resolving to one.
    pub host: String,
    /// Mooncake transport protocol: "tcp" (works everywhere) or "rdma".
    pub protocol: String,
    pub backoff: Backoff,
    /// Most transfer tasks one write keeps in flight (see `pending`).
    /// Default: Mooncake's per-peer TCP queue,
    /// `MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER` when set, else 1024.
    pub max_tasks_in_flight: usize,
}

impl Default for MooncakeConfig {
    fn default() -> Self {
        let queue = std::env::var("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER").ok().and_then(|v| v.parse().ok()).unwrap_or(1024usize);
        Self { host: "127.0.0.1".into(), protocol: "tcp".into(), backoff: Backoff::default(), max_tasks_in_flight: queue.max(1) }
    }
}

/// Where the engine's listeners ended up. Mooncake binds them to the
/// wildcard address and has no setting for it; they are started inside
/// [`sys::bind_scope::restrict_binds`], which moves those binds to the
/// configured address without changing Mooncake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listeners {
    /// The address they were meant to bind.
    pub addr: std::net::IpAddr,
    /// Every address bound while starting the engine.
    pub bound: Vec<std::net::SocketAddr>,
    /// The listeners among them, put under the accept guard
    /// ([`sys::accept_guard`]: only allowed peers and this user's local
    /// processes get in); released when the transport drops.
    pub guarded: Vec<(i32, std::net::SocketAddr)>,
    /// Ports still on the wildcard address (reachable from every network
    /// the host is on); empty when every listener was restricted.
    pub wildcard_ports: Vec<u16>,
    /// False when no bind was seen at all (this build could not interpose
    /// `bind`, so nothing is known to be restricted).
    pub interposed: bool,
}

impl Listeners {
    /// Every listener is on `addr`.
    pub fn restricted(&self) -> bool {
        self.interposed && self.wildcard_ports.is_empty()
    }
}

/// Lets KV transport connections from `ip` in (a peer that proved the
/// cluster token, or that this worker calls with it); see
/// [`sys::accept_guard`].
pub fn allow_peer(ip: std::net::IpAddr) {
    sys::accept_guard::allow_peer(ip);
}

/// KV transport connections refused by the accept guard so far.
pub fn refused_connections() -> u64 {
    sys::accept_guard::refused()
}

/// The IP address `host` names (a literal, else its first resolution).
pub fn host_ip(host: &str) -> Result<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse() {
        return Ok(ip);
    }
    (host, 0).to_socket_addrs().ok().and_then(|mut a| a.next()).map(|a| a.ip()).ok_or_else(|| DisaggError::Engine {
        call: "createTransferEngine",
        code: -1,
        detail: format!(": {host:?} is neither an IP address nor a name that resolves to one"),
    })
}

pub struct MooncakeTransport {
    engine: sys::transfer_engine_t,
    listeners: Listeners,
    local: HandshakeRecord,
    /// The pool's region is registered with the engine.
    registered: bool,
    backoff: Backoff,
    window: usize,
    /// Batches allocated and not yet freed (in flight or parked).
    open_batches: AtomicUsize,
    /// Batches (with their task counts) whose tasks Mooncake had not all
    /// finished when they were released; freed on later calls and at drop.
    parked: Mutex<Vec<(sys::batch_id_t, usize)>>,
}

// SAFETY: Mooncake's TransferEngine is used from many threads by its own
// callers (batches are independent; its internal state is locked); the
// raw pointer is only passed back to it.
unsafe impl Send for MooncakeTransport {}
unsafe impl Sync for MooncakeTransport {}

/// Engines started before giving up: Mooncake picks its listening ports
/// at random and fails (rather than trying another) when one is taken.
const START_ATTEMPTS: usize = 8;

/// [`start_engine`] with its listeners bound to `config.host`'s address.
fn start_engine_restricted(config: &MooncakeConfig) -> Result<(sys::transfer_engine_t, Listeners)> {
    let addr = host_ip(&config.host)?;
    let (engine, seen) = sys::bind_scope::restrict_binds(addr, || start_engine(config));
    let engine = engine?;
    let bound: Vec<_> = seen.iter().filter(|b| b.ok).map(|b| b.bound).collect();
    let mut wildcard_ports: Vec<u16> = seen.iter().filter(|b| b.ok && b.is_wildcard()).map(|b| b.bound.port()).collect();
    wildcard_ports.dedup();
    // Sockets closed since (a port probe) are dropped by `guard`.
    let candidates: Vec<(i32, std::net::SocketAddr)> = seen.iter().filter(|b| b.ok).map(|b| (b.fd, b.bound)).collect();
    let guarded = sys::accept_guard::guard(&candidates);
    Ok((engine, Listeners { addr, interposed: !bound.is_empty(), bound, guarded, wildcard_ports }))
}

/// An engine with P2P-handshake metadata and `config.protocol` installed.
fn start_engine(config: &MooncakeConfig) -> Result<sys::transfer_engine_t> {
    let meta = cstring("createTransferEngine", "P2PHANDSHAKE")?;
    let host = cstring("createTransferEngine", &config.host)?;
    let empty = cstring("createTransferEngine", "")?;
    let proto = cstring("installTransport", &config.protocol)?;
    let mut failed = "createTransferEngine";
    for attempt in 1..=START_ATTEMPTS {
        // SAFETY: valid C strings for the duration of the calls; the engine
        // is destroyed here unless returned.
        unsafe {
            let engine = sys::createTransferEngine(meta.as_ptr(), host.as_ptr(), empty.as_ptr(), 0, 0);
            if engine.is_null() {
                failed = "createTransferEngine";
            } else if sys::installTransport(engine, proto.as_ptr(), ptr::null_mut()).is_null() {
                failed = "installTransport";
                sys::destroyTransferEngine(engine);
            } else {
                return Ok(engine);
            }
        }
        debug!(event = "kv_transport_start_retry", attempt, failed);
    }
    Err(DisaggError::Engine {
        call: failed,
        code: -1,
        detail: format!(" ({} on {}, {START_ATTEMPTS} attempts)", config.protocol, config.host),
    })
}

fn cstring(what: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| DisaggError::Engine { call: what, code: -1, detail: format!(": {s:?} contains a NUL byte") })
}

impl MooncakeTransport {
    /// Names what computes the KV in this pool (the engine's weights
    /// identity), so that the handshake refuses a peer whose KV other
    /// weights compute.
    pub fn set_weights(&mut self, weights: impl Into<String>) {
        self.local.weights = weights.into();
    }

    /// Starts an engine and registers `memory` with it.
    pub fn new(config: &MooncakeConfig, memory: PoolMemory) -> Result<Self> {
        sys::ensure_available()?;
        let (engine, listeners) = start_engine_restricted(config)?;
        // From here on, Drop cleans up whatever was set up.
        let mut this = Self {
            engine,
            listeners,
            local: HandshakeRecord::describe(&memory.layout, memory.num_blocks, memory.region, String::new()),
            registered: false,
            backoff: config.backoff,
            window: config.max_tasks_in_flight,
            open_batches: AtomicUsize::new(0),
            parked: Mutex::new(Vec::new()),
        };
        let mut name = [0 as c_char; 256];
        // SAFETY: live engine; the buffer and its length match.
        let rc = unsafe { sys::getLocalIpAndPort(this.engine, name.as_mut_ptr(), name.len()) };
        if rc != 0 {
            return Err(DisaggError::Engine { call: "getLocalIpAndPort", code: rc.into(), detail: String::new() });
        }
        // SAFETY: NUL-terminated by the callee.
        this.local.segment = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        this.local.validate()?;
        // Mooncake's location names: "*" lets it find host memory's NUMA
        // node; "cuda:N" marks device memory (staged or sent by the GPU path
        // of the installed transport).
        let location = match memory.region.location {
            MemoryLocation::Host => "*".to_string(),
            MemoryLocation::Cuda(n) => format!("cuda:{n}"),
        };
        let anywhere = cstring("registerLocalMemory", &location)?;
        // SAFETY: the caller of PoolMemory::of_storage promised the region
        // outlives this transport; Drop unregisters it.
        let rc = unsafe { sys::registerLocalMemory(this.engine, memory.region.addr as *mut _, memory.region.len, anywhere.as_ptr(), 1) };
        if rc != 0 {
            return Err(DisaggError::Engine {
                call: "registerLocalMemory",
                code: rc.into(),
                detail: format!(" ({} bytes at {location})", memory.region.len),
            });
        }
        this.registered = true;
        debug!(event = "kv_transport_started", segment = %this.local.segment, bytes = memory.region.len);
        Ok(this)
    }

    /// Starts writing `copies` into `peer`; the returned handle polls or
    /// waits for completion.
    pub fn submit_write(&self, peer: &Peer, copies: &[BlockCopy]) -> Result<PendingWrite<'_>> {
        let started = Instant::now();
        self.free_parked();
        let plan = plan_writes(&self.local, &peer.record, copies)?;
        let segment = peer.handle as sys::segment_id_t;
        let requests: Vec<sys::transfer_request> = plan
            .iter()
            .map(|r| sys::transfer_request {
                opcode: sys::OPCODE_WRITE,
                source: (self.local.base_addr + r.src_offset) as *mut _,
                target_id: segment,
                file_id: 0,
                target_offset: peer.record.base_addr + r.dst_offset,
                length: r.len,
            })
            .collect();
        PendingWrite::start(self, peer.name().to_string(), requests, self.window, started)
    }

    /// Allocates a batch for `requests` and submits them.
    pub(super) fn submit_batch(&self, requests: &mut [sys::transfer_request], peer: &str) -> Result<sys::batch_id_t> {
        // SAFETY: live engine.
        let batch = unsafe { sys::allocateBatchID(self.engine, requests.len()) };
        if batch == sys::INVALID_BATCH {
            return Err(DisaggError::Engine { call: "allocateBatchID", code: -1, detail: format!(" for {} tasks", requests.len()) });
        }
        self.open_batches.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the requests point into the registered local region and
        // the peer's region as its record describes (checked by the plan).
        let rc = unsafe { sys::submitTransfer(self.engine, batch, requests.as_mut_ptr(), requests.len()) };
        if rc != 0 {
            self.release_batch(batch, requests.len(), false);
            return Err(DisaggError::Engine { call: "submitTransfer", code: rc.into(), detail: format!(" to {peer}") });
        }
        Ok(batch)
    }

    /// Batches allocated and not yet freed: in flight, or released while
    /// Mooncake still held them. Zero once every transfer has finished
    /// (successfully or not) and its batch was freed.
    pub fn open_batches(&self) -> usize {
        self.open_batches.load(Ordering::Relaxed)
    }

    /// Tries again to free batches Mooncake still held when released;
    /// returns how many remain parked.
    pub fn free_parked(&self) -> usize {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.retain(|&(batch, tasks)| !self.try_free(batch, tasks));
        parked.len()
    }

    /// Where the engine's listeners are.
    pub fn listeners(&self) -> &Listeners {
        &self.listeners
    }

    pub(super) fn engine(&self) -> sys::transfer_engine_t {
        self.engine
    }

    pub(super) fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Frees `batch` of `tasks` tasks, or parks it while Mooncake still has
    /// unfinished tasks in it (a failed transfer's queued tasks fail about
    /// a second after the peer's connection dies).
    /// `all_seen_finished`: every task's status was just read as finished,
    /// so Mooncake knows and the sweep in `try_free` can be skipped.
    pub(super) fn release_batch(&self, batch: sys::batch_id_t, tasks: usize, all_seen_finished: bool) {
        if !self.try_free(batch, if all_seen_finished { 0 } else { tasks }) {
            self.parked.lock().unwrap_or_else(|p| p.into_inner()).push((batch, tasks));
        }
    }

    /// Reads the status of the first `tasks` tasks, then frees the batch.
    fn try_free(&self, batch: sys::batch_id_t, tasks: usize) -> bool {
        // Mooncake records that a task has finished (successfully or not)
        // only when its status is read, and refuses to free a batch holding
        // tasks it has not seen finish: read them all first.
        for task in 0..tasks {
            let mut st = sys::transfer_status::default();
            // SAFETY: live engine; `batch` is allocated and has `tasks` tasks.
            unsafe { sys::getTransferStatus(self.engine, batch, task, &mut st) };
        }
        // SAFETY: live engine; `batch` was allocated by it and not freed.
        let rc = unsafe { sys::freeBatchID(self.engine, batch) };
        if rc == 0 {
            self.open_batches.fetch_sub(1, Ordering::Relaxed);
        }
        rc == 0
    }
}

impl KvTransport for MooncakeTransport {
    fn local_record(&self) -> &HandshakeRecord {
        &self.local
    }

    fn connect(&self, remote: &HandshakeRecord) -> Result<Peer> {
        self.local.check_compatible(remote)?;
        let name = cstring("openSegment", &remote.segment)?;
        // SAFETY: live engine, valid C string.
        let segment = unsafe { sys::openSegment(self.engine, name.as_ptr()) };
        if segment < 0 {
            return Err(DisaggError::Engine { call: "openSegment", code: segment.into(), detail: format!(" ({})", remote.segment) });
        }
        debug!(event = "kv_peer_connected", peer = %remote.segment, segment);
        Ok(Peer { record: remote.clone(), handle: segment.into() })
    }

    fn write_blocks(&self, peer: &Peer, copies: &[BlockCopy], timeout: Duration) -> Result<TransferReport> {
        let result = self.submit_write(peer, copies).and_then(|p| p.wait(timeout));
        match &result {
            Ok(r) => {
                debug!(event = "kv_transfer", peer = %peer.name(), bytes = r.bytes, ranges = r.ranges, micros = r.elapsed.as_micros() as u64)
            }
            Err(e) => warn!(event = "kv_transfer_failed", peer = %peer.name(), error = %e),
        }
        result
    }

    fn disconnect(&self, peer: Peer) -> Result<()> {
        // SAFETY: live engine; the segment was opened by it.
        let rc = unsafe { sys::closeSegment(self.engine, peer.handle as sys::segment_id_t) };
        if rc != 0 {
            return Err(DisaggError::Engine { call: "closeSegment", code: rc.into(), detail: format!(" ({})", peer.name()) });
        }
        Ok(())
    }
}

impl Drop for MooncakeTransport {
    fn drop(&mut self) {
        let parked = self.free_parked();
        if parked > 0 {
            warn!(event = "kv_transport_parked_batches", parked, "destroying the engine with unfinished batches");
        }
        // SAFETY: live engine; the region is registered if `registered`;
        // nothing uses the engine after this.
        unsafe {
            if self.registered {
                sys::unregisterLocalMemory(self.engine, self.local.base_addr as *mut _);
            }
            sys::destroyTransferEngine(self.engine);
        }
        // Its listeners are closed: their fds may be reused.
        sys::accept_guard::unguard(&self.listeners.guarded);
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;
    use kvc_kv_pool::{KvLayout, KvStorage};

    use super::*;

    fn storage(num_blocks: usize, seed: u8) -> KvStorage {
        let layout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 16, block_size: 4, dtype: DType::BF16 };
        let mut s = KvStorage::new(layout, num_blocks).unwrap();
        for layer in 0..2 {
            for block in 0..num_blocks as u32 {
                let bytes: Vec<u8> =
                    (0..layout.layer_block_bytes()).map(|i| (i as u8) ^ (block as u8).wrapping_mul(seed) ^ layer as u8).collect();
                s.set_block_bytes(layer, block, &bytes).unwrap();
            }
        }
        s
    }

    fn transport(s: &KvStorage) -> MooncakeTransport {
        transport_with(s, &MooncakeConfig::default())
    }

    fn transport_with(s: &KvStorage, config: &MooncakeConfig) -> MooncakeTransport {
        // SAFETY: every storage outlives its transport in these tests.
        let memory = unsafe { PoolMemory::of_storage(s) }.unwrap();
        MooncakeTransport::new(config, memory).unwrap_or_else(|e| panic!("this test needs Mooncake: {e}"))
    }

    /// Transports of `a` and `b`, `a`'s connected to `b`'s (the caller keeps
    /// both: `b`'s engine is the one written to).
    fn connected(a: &KvStorage, b: &KvStorage) -> (MooncakeTransport, MooncakeTransport, Peer) {
        let (ta, tb) = (transport(a), transport(b));
        let peer = ta.connect(tb.local_record()).unwrap();
        (ta, tb, peer)
    }

    /// Every block of both layers, sent to the mirrored block: nothing
    /// coalesces, one task per block and layer.
    fn mirrored(num_blocks: u32) -> Vec<BlockCopy> {
        let src: Vec<u32> = (0..num_blocks).collect();
        let dst: Vec<u32> = src.iter().rev().copied().collect();
        BlockCopy::all_layers(2, &src, &dst)
    }

    #[test]
    fn scattered_blocks_arrive_between_two_engines_of_one_process() {
        let (a, b) = (storage(16, 7), storage(24, 0));
        let (ta, _tb, peer) = connected(&a, &b);
        let (src, dst) = ([3u32, 4, 5, 9, 0], [20u32, 21, 22, 1, 7]);
        let copies = BlockCopy::all_layers(2, &src, &dst);
        let report = ta.write_blocks(&peer, &copies, Duration::from_secs(10)).unwrap();
        assert_eq!(report.bytes, copies.len() as u64 * a.layout().layer_block_bytes() as u64);
        assert_eq!(report.ranges, 2 * 3, "one range per run per layer");
        for c in &copies {
            assert_eq!(a.block_bytes(c.layer as usize, c.src), b.block_bytes(c.layer as usize, c.dst), "{c:?}");
        }
        assert_eq!(ta.open_batches(), 0);
        ta.disconnect(peer).unwrap();
    }

    #[test]
    fn writes_of_more_tasks_than_mooncake_queues_per_peer_arrive_intact() {
        // 6000 tasks: Mooncake's TCP transport fails tasks beyond about
        // 2048 queued for one peer, so they must go out through the window.
        let (a, b) = (storage(3000, 3), storage(3000, 0));
        let (ta, _tb, peer) = connected(&a, &b);
        let copies = mirrored(3000);
        assert_eq!(ta.write_blocks(&peer, &copies, Duration::from_secs(30)).unwrap().ranges, 6000);
        assert!(copies.iter().all(|c| a.block_bytes(c.layer as usize, c.src) == b.block_bytes(c.layer as usize, c.dst)));
        assert_eq!(ta.open_batches(), 0);
    }

    #[test]
    fn a_window_of_a_few_tasks_still_delivers_everything_in_many_batches() {
        let (a, b) = (storage(50, 5), storage(50, 0));
        let config = MooncakeConfig { max_tasks_in_flight: 3, ..MooncakeConfig::default() };
        let (ta, tb) = (transport_with(&a, &config), transport(&b));
        let peer = ta.connect(tb.local_record()).unwrap();
        let copies = mirrored(50);
        let mut pending = ta.submit_write(&peer, &copies).unwrap();
        assert!(ta.open_batches() <= 2, "at most two batches of 2 tasks in flight");
        assert_eq!(pending.tasks(), 100);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pending.poll().unwrap() {
            assert!(ta.open_batches() <= 2);
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!(pending.done_bytes(), pending.total_bytes());
        assert!(copies.iter().all(|c| a.block_bytes(c.layer as usize, c.src) == b.block_bytes(c.layer as usize, c.dst)));
        assert_eq!(ta.open_batches(), 0);
    }

    #[test]
    fn invalid_copies_are_refused_before_anything_is_sent() {
        let (a, b) = (storage(4, 1), storage(4, 2));
        let (ta, _tb, peer) = connected(&a, &b);
        let err = ta.write_blocks(&peer, &[BlockCopy { layer: 0, src: 0, dst: 4 }], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, DisaggError::BlockOutOfRange { side: "destination", .. }), "{err}");
        assert_eq!(ta.open_batches(), 0);
    }

    #[test]
    fn empty_write_completes_at_once() {
        let (a, b) = (storage(2, 1), storage(2, 2));
        let (ta, _tb, peer) = connected(&a, &b);
        assert_eq!(ta.write_blocks(&peer, &[], Duration::from_secs(1)).unwrap().bytes, 0);
    }

    #[test]
    fn incompatible_peer_is_refused_at_connect() {
        let a = storage(2, 1);
        let layout = KvLayout { head_dim: 8, ..*a.layout() };
        let b = KvStorage::new(layout, 2).unwrap();
        let (ta, tb) = (transport(&a), transport(&b));
        let err = ta.connect(tb.local_record()).unwrap_err();
        assert!(matches!(err, DisaggError::Incompatible { field: "head_dim", .. }), "{err}");
    }
}
