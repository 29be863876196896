//! Two processes on 127.0.0.1, each with a KV pool behind a Mooncake
//! transport: this test process (pool A) and a peer process (pool B,
//! `kvc-transfer-bench peer`), handshaking over the control channel.
//!
//! These tests need Mooncake; without it they fail with the error that
//! says to run `bash scripts/mooncake_setup.sh`.

use std::time::{Duration, Instant};

use kvc_disagg::loopback::{fill_pool, hash_blocks, sides, PeerCommand, PeerProcess, PeerReply, PoolSpec};
use kvc_disagg::{handshake, BlockCopy, DisaggError, KvTransport, MooncakeConfig, MooncakeTransport, Peer, PoolMemory};
use kvc_kv_pool::{KvPool, KvStorage};

const PEER_EXE: &str = env!("CARGO_BIN_EXE_kvc-transfer-bench");
const STARTUP: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_secs(10);

/// 4 layers x 2 kv heads x 64 head dim x 16 tokens, bf16: 8 KiB per block and layer.
fn spec(num_blocks: usize) -> PoolSpec {
    PoolSpec { layers: 4, kv_heads: 2, head_dim: 64, block_size: 16, dtype: "bf16".into(), num_blocks }
}

/// This process's side: a pool and the transport registered over it.
struct Local {
    // Dropped first: the transport must go before the memory it registered.
    transport: MooncakeTransport,
    pool: KvPool,
}

impl Local {
    fn new(spec: &PoolSpec, seed: u64) -> Self {
        let mut pool = KvPool::new(spec.layout().unwrap(), spec.num_blocks).unwrap();
        fill_pool(&mut pool.storage, seed).unwrap();
        // SAFETY: `pool` outlives `transport` (field order above), and the
        // storage is never reallocated.
        let memory = unsafe { PoolMemory::of_storage(&pool.storage) }.unwrap();
        let transport = MooncakeTransport::new(&MooncakeConfig::default(), memory).unwrap_or_else(|e| panic!("{e}"));
        Self { transport, pool }
    }

    fn storage(&self) -> &KvStorage {
        &self.pool.storage
    }

    /// Spawns a peer with pool `peer_spec` filled from `peer_seed`,
    /// handshakes, and opens it.
    fn spawn_peer(&self, peer_spec: &PoolSpec, peer_seed: u64) -> (PeerProcess, Peer) {
        let mut proc = PeerProcess::spawn(PEER_EXE.as_ref(), peer_spec, STARTUP).unwrap_or_else(|e| panic!("{e}"));
        let remote = handshake::exchange(&mut proc.channel, self.transport.local_record())
            .unwrap_or_else(|e| panic!("handshake: {e}\npeer stderr:\n{}", proc.stderr_tail()));
        let peer = self.transport.connect(&remote).unwrap();
        assert_eq!(proc.command(&PeerCommand::Fill { seed: peer_seed }).unwrap(), PeerReply::Done);
        (proc, peer)
    }
}

fn peer_hash(proc: &mut PeerProcess, blocks: Vec<(u32, u32)>) -> String {
    match proc.command(&PeerCommand::Hash { blocks }).unwrap() {
        PeerReply::Hash { hex } => hex,
        other => panic!("peer answered {other:?}; stderr:\n{}", proc.stderr_tail()),
    }
}

/// Copies with runs and singletons, different in every layer, destination
/// ids unrelated to source ids.
fn scattered(num_layers: u32) -> Vec<BlockCopy> {
    let mut copies = Vec::new();
    for layer in 0..num_layers {
        let pairs = [(3, 50), (4, 51), (5, 52), (17, 0), (30, 9), (31, 10), (8 + layer, 33 + 2 * layer), (39, 63 - layer)];
        copies.extend(pairs.iter().map(|&(src, dst)| BlockCopy { layer, src, dst }));
    }
    copies
}

/// Polls (with a deadline) until Mooncake has let go of every batch.
fn wait_all_batches_freed(transport: &MooncakeTransport) {
    let deadline = Instant::now() + TIMEOUT;
    while transport.free_parked() > 0 {
        assert!(Instant::now() < deadline, "Mooncake still holds a failed batch");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(transport.open_batches(), 0);
}

fn all_blocks(spec: &PoolSpec) -> Vec<(u32, u32)> {
    (0..spec.layers as u32).flat_map(|l| (0..spec.num_blocks as u32).map(move |b| (l, b))).collect()
}

#[test]
fn scattered_blocks_written_a_to_b_arrive_byte_identical_and_nothing_else_changes() {
    let (spec_a, spec_b) = (spec(40), spec(64));
    let a = Local::new(&spec_a, 1);
    let (mut proc, peer) = a.spawn_peer(&spec_b, 2);
    let copies = scattered(4);

    let report = a.transport.write_blocks(&peer, &copies, TIMEOUT).unwrap();
    assert_eq!(report.bytes, copies.len() as u64 * 8192);
    assert_eq!(report.ranges, 4 * 5, "per layer: a run of 3, a run of 2, three singletons");

    let (src, dst) = sides(&copies);
    assert_eq!(hash_blocks(a.storage(), &src).unwrap(), peer_hash(&mut proc, dst.clone()), "written blocks differ");
    // Every other block of B still holds what B's own fill put there.
    let mut expect_b = spec_b.storage().unwrap();
    fill_pool(&mut expect_b, 2).unwrap();
    let untouched: Vec<(u32, u32)> = all_blocks(&spec_b).into_iter().filter(|b| !dst.contains(b)).collect();
    assert_eq!(hash_blocks(&expect_b, &untouched).unwrap(), peer_hash(&mut proc, untouched), "blocks outside the list changed");

    assert_eq!(proc.command(&PeerCommand::Exit).unwrap(), PeerReply::Bye);
    assert!(proc.wait_exit(TIMEOUT).unwrap().success());
}

#[test]
fn both_directions_between_the_same_two_engines_arrive_byte_identical() {
    let spec = spec(64);
    let a = Local::new(&spec, 11);
    let (mut proc, peer) = a.spawn_peer(&spec, 22);

    // A -> B
    let ab = scattered(4);
    a.transport.write_blocks(&peer, &ab, TIMEOUT).unwrap();
    let (a_src, b_dst) = sides(&ab);
    assert_eq!(hash_blocks(a.storage(), &a_src).unwrap(), peer_hash(&mut proc, b_dst.clone()));

    // B -> A, from blocks B did not just receive into blocks A did not send.
    let ba: Vec<BlockCopy> =
        (0..4).flat_map(|layer| [(40, 20), (41, 21), (42, 22), (1, 45), (7, 12)].map(|(src, dst)| BlockCopy { layer, src, dst })).collect();
    let (b_src, a_dst) = sides(&ba);
    assert!(b_src.iter().all(|b| !b_dst.contains(b)) && a_dst.iter().all(|b| !a_src.contains(b)));
    match proc.command(&PeerCommand::Write { copies: ba.clone(), timeout_ms: TIMEOUT.as_millis() as u64 }).unwrap() {
        PeerReply::Written { bytes, ranges, .. } => {
            assert_eq!(bytes, ba.len() as u64 * 8192);
            assert_eq!(ranges, 4 * 3);
        }
        other => panic!("B -> A: {other:?}; peer stderr:\n{}", proc.stderr_tail()),
    }
    assert_eq!(peer_hash(&mut proc, b_src), hash_blocks(a.storage(), &a_dst).unwrap());

    // And A -> B again over the same engines, into what B just sent from.
    let again: Vec<BlockCopy> = (0..4).map(|layer| BlockCopy { layer, src: 20, dst: 40 }).collect();
    a.transport.write_blocks(&peer, &again, TIMEOUT).unwrap();
    let (s, d) = sides(&again);
    assert_eq!(hash_blocks(a.storage(), &s).unwrap(), peer_hash(&mut proc, d));

    assert_eq!(proc.command(&PeerCommand::Exit).unwrap(), PeerReply::Bye);
    assert!(proc.wait_exit(TIMEOUT).unwrap().success());
}

#[test]
fn peer_killed_mid_transfer_gives_a_typed_error_within_the_timeout_and_releases_the_sender() {
    // 128 MiB, long enough to interrupt.
    let spec = PoolSpec { layers: 4, kv_heads: 8, head_dim: 128, block_size: 16, dtype: "bf16".into(), num_blocks: 512 };
    let mut a = Local::new(&spec, 5);
    let (mut proc, peer) = a.spawn_peer(&spec, 6);
    a.transport.write_blocks(&peer, &[BlockCopy { layer: 0, src: 0, dst: 0 }], TIMEOUT).expect("a first small write works");

    // The sender pins the blocks it sends, as the engine will. Reversed on
    // the receiving side: 2048 separate 64 KiB tasks.
    let blocks = a.pool.allocator.allocate(512).unwrap();
    let reversed: Vec<u32> = blocks.iter().rev().copied().collect();
    let copies = BlockCopy::all_layers(4, &blocks, &reversed);

    // Start the transfer; once the peer has confirmed part of it, freeze the
    // peer (the rest cannot complete: no more acknowledgements come), then
    // kill it. On this small machine the whole transfer sometimes finishes
    // before the test thread gets to look; then it simply goes again.
    let pid = proc.pid() as i32;
    let mut attempts = 0;
    let pending = loop {
        attempts += 1;
        assert!(attempts <= 20, "could not catch the transfer in flight in 20 attempts");
        let mut pending = a.transport.submit_write(&peer, &copies).unwrap();
        let deadline = Instant::now() + TIMEOUT;
        while pending.done_bytes() == 0 && !pending.poll().unwrap() {
            assert!(Instant::now() < deadline, "no progress");
            std::thread::sleep(Duration::from_micros(20));
        }
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        if !pending.poll().unwrap() {
            break pending;
        }
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    };
    let confirmed = pending.done_bytes();
    assert!(confirmed > 0 && confirmed < pending.total_bytes());
    assert!(a.transport.open_batches() >= 1);
    proc.kill();

    let t0 = Instant::now();
    let err = pending.wait(TIMEOUT).unwrap_err();
    let waited = t0.elapsed();
    eprintln!("after the kill: {err} ({waited:?})");
    assert!(matches!(err, DisaggError::TransferFailed { .. } | DisaggError::Timeout { .. }), "untyped failure: {err}");
    assert!(waited < TIMEOUT + Duration::from_secs(1), "took {waited:?}");
    if let DisaggError::TransferFailed { done_bytes, total_bytes, .. } = err {
        assert!(done_bytes < total_bytes);
    }

    // Mooncake lets go of the batch (it no longer reads those blocks), so
    // the blocks can go back to the pool.
    wait_all_batches_freed(&a.transport);
    a.pool.allocator.free_all(&blocks);
    assert_eq!(a.pool.allocator.num_free(), 512);

    // Writing to the dead peer again fails fast with a typed error too.
    let t0 = Instant::now();
    let again = a.transport.write_blocks(&peer, &copies[..8], TIMEOUT);
    assert!(again.is_err(), "a write to a dead peer succeeded");
    assert!(t0.elapsed() < TIMEOUT + Duration::from_secs(1));
    wait_all_batches_freed(&a.transport);

    // The sender's engine still serves a new peer.
    let (mut proc2, peer2) = a.spawn_peer(&spec, 7);
    let small = scattered(4);
    a.transport.write_blocks(&peer2, &small, TIMEOUT).unwrap();
    let (s, d) = sides(&small);
    assert_eq!(hash_blocks(a.storage(), &s).unwrap(), peer_hash(&mut proc2, d));
    assert_eq!(proc2.command(&PeerCommand::Exit).unwrap(), PeerReply::Bye);
}

#[test]
fn mismatched_layout_is_refused_at_handshake_on_both_sides() {
    let a = Local::new(&spec(8), 1);
    let other = PoolSpec { head_dim: 128, ..spec(8) };
    let mut proc = PeerProcess::spawn(PEER_EXE.as_ref(), &other, STARTUP).unwrap_or_else(|e| panic!("{e}"));
    let err = handshake::exchange(&mut proc.channel, a.transport.local_record()).unwrap_err();
    match &err {
        DisaggError::Incompatible { field, local, remote } => {
            assert_eq!((*field, local.as_str(), remote.as_str()), ("head_dim", "64", "128"));
        }
        other => panic!("expected Incompatible(head_dim), got {other}"),
    }
    // The peer refuses too and exits with an error naming the field.
    let status = proc.wait_exit(TIMEOUT).unwrap();
    assert!(!status.success());
    assert!(proc.stderr_tail().contains("head_dim"), "peer stderr:\n{}", proc.stderr_tail());
    // Nothing was opened: connect refuses the same record.
    let remote_record = { kvc_disagg::HandshakeRecord { head_dim: 128, ..a.transport.local_record().clone() } };
    assert!(matches!(a.transport.connect(&remote_record), Err(DisaggError::Incompatible { field: "head_dim", .. })));
}
