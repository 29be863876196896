//! What is moved (block lists of a given size and shape) and moving it
//! through kvc's transport to a peer process.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kvc_disagg::loopback::{fill_pool, hash_blocks, sides, PeerCommand, PeerProcess, PeerReply, PoolSpec};
use kvc_disagg::plan::{plan_writes, ByteRange};
use kvc_disagg::transport::Backoff;
use kvc_disagg::{handshake, BlockCopy, KvTransport, MooncakeConfig, MooncakeTransport, Peer, PoolMemory};
use kvc_kv_pool::KvStorage;
use rand::rngs::StdRng;
use rand::SeedableRng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// One run of consecutive blocks on each side: one range per layer.
    Contiguous,
    /// Random distinct blocks on each side: one range per block and layer.
    Scattered,
}

pub struct Workload {
    pub spec: PoolSpec,
    pub pattern: Pattern,
    pub copies: Vec<BlockCopy>,
    pub bytes: u64,
    pub seed: u64,
}

impl Workload {
    /// `bytes` rounded up to whole blocks (all layers), in pools 1.5x that
    /// size on both sides.
    pub fn new(shape: &PoolSpec, bytes: u64, pattern: Pattern, seed: u64) -> Result<Self> {
        let layout = shape.layout()?;
        let per_block = layout.bytes_per_block() as u64;
        let needed = bytes.div_ceil(per_block) as usize;
        let pool = needed + needed.div_ceil(2);
        let (src, dst): (Vec<u32>, Vec<u32>) = match pattern {
            Pattern::Contiguous => ((0..needed as u32).collect(), ((pool - needed) as u32..pool as u32).collect()),
            Pattern::Scattered => {
                let mut rng = StdRng::seed_from_u64(seed);
                let pick = |rng: &mut StdRng| rand::seq::index::sample(rng, pool, needed).into_iter().map(|b| b as u32).collect::<Vec<_>>();
                (pick(&mut rng), pick(&mut rng))
            }
        };
        let copies = BlockCopy::all_layers(layout.num_layers, &src, &dst);
        let spec = PoolSpec { num_blocks: pool, ..shape.clone() };
        Ok(Self { spec, pattern, copies, bytes: needed as u64 * per_block, seed })
    }

    pub fn label(&self) -> String {
        format!("{} MiB {:?}", self.bytes >> 20, self.pattern)
    }
}

/// This process's pool and transport, a peer process, and the opened peer.
pub struct KvcSession {
    // Field order is drop order: the transport goes before its memory.
    transport: MooncakeTransport,
    peer_proc: PeerProcess,
    peer: Option<Peer>,
    storage: KvStorage,
    copies: Vec<BlockCopy>,
    timeout: Duration,
    /// The coalesced ranges kvc sends (the baseline sends the same).
    pub plan: Vec<ByteRange>,
    /// CPU time of kvc's own planning (validation + coalescing) per
    /// transfer, included in every sample.
    pub plan_time: Duration,
}

impl KvcSession {
    /// Spawns a peer (this executable's `peer` mode), handshakes, and fills
    /// both pools (touching every page, and making the peer's blocks differ
    /// from ours).
    pub fn start(exe: &Path, w: &Workload, backoff_max: Duration, timeout: Duration) -> Result<Self> {
        let mut storage = w.spec.storage()?;
        fill_pool(&mut storage, w.seed)?;
        let config = MooncakeConfig { backoff: Backoff { max: backoff_max, ..Backoff::default() }, ..MooncakeConfig::default() };
        // SAFETY: `storage` is dropped after `transport` (field order).
        let transport = MooncakeTransport::new(&config, unsafe { PoolMemory::of_storage(&storage) }?)?;
        let mut peer_proc = PeerProcess::spawn(exe, &w.spec, Duration::from_secs(60))?;
        let remote = handshake::exchange(&mut peer_proc.channel, transport.local_record())?;
        let peer = transport.connect(&remote)?;
        expect(peer_proc.command(&PeerCommand::Fill { seed: w.seed + 1 })?, PeerReply::Done, &peer_proc)?;

        const PLANS: u32 = 5;
        let t0 = Instant::now();
        for _ in 1..PLANS {
            plan_writes(transport.local_record(), &remote, &w.copies)?;
        }
        let plan = plan_writes(transport.local_record(), &remote, &w.copies)?;
        let plan_time = t0.elapsed() / PLANS;
        Ok(Self { transport, peer_proc, peer: Some(peer), storage, copies: w.copies.clone(), timeout, plan, plan_time })
    }

    /// One transfer of the whole block list, timed.
    pub fn iteration(&mut self) -> Result<Duration> {
        let t0 = Instant::now();
        self.transport.write_blocks(self.peer.as_ref().unwrap(), &self.copies, self.timeout)?;
        Ok(t0.elapsed())
    }

    /// Checks by hash that the peer's blocks equal ours, and stops the peer.
    pub fn finish(mut self) -> Result<bool> {
        let (src, dst) = sides(&self.copies);
        let ours = hash_blocks(&self.storage, &src)?;
        let theirs = match self.peer_proc.command(&PeerCommand::Hash { blocks: dst })? {
            PeerReply::Hash { hex } => hex,
            other => bail!("peer answered {other:?} to hash; stderr:\n{}", self.peer_proc.stderr_tail()),
        };
        expect(self.peer_proc.command(&PeerCommand::Exit)?, PeerReply::Bye, &self.peer_proc)?;
        self.peer_proc.wait_exit(Duration::from_secs(30))?;
        self.transport.disconnect(self.peer.take().unwrap())?;
        Ok(ours == theirs)
    }
}

fn expect(got: PeerReply, want: PeerReply, peer: &PeerProcess) -> Result<()> {
    if got != want {
        bail!("peer answered {got:?} (expected {want:?}); stderr:\n{}", peer.stderr_tail());
    }
    Ok(())
}
