//! A second process holding a KV pool behind a [`MooncakeTransport`],
//! driven over the control channel: the peer of the two-process tests and
//! of `kvc-transfer-bench`. The coordinator listens on 127.0.0.1, spawns
//! `kvc-transfer-bench peer --control <addr> <pool>`, and after the
//! handshake sends [`PeerCommand`]s; the peer answers each with a
//! [`PeerReply`].

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::DType;
use kvc_kv_pool::{BlockId, KvLayout, KvStorage};
use serde::{Deserialize, Serialize};

use crate::control::ControlChannel;
use crate::handshake;
use crate::plan::BlockCopy;
use crate::transport::{KvTransport, MooncakeConfig, MooncakeTransport, PoolMemory};
use crate::{DisaggError, Result};

/// The shape of a pool, as command-line flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct PoolSpec {
    #[arg(long, default_value_t = 48)]
    pub layers: usize,
    #[arg(long, default_value_t = 4)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    #[arg(long, default_value_t = 64)]
    pub num_blocks: usize,
}

impl PoolSpec {
    pub fn layout(&self) -> Result<KvLayout> {
        let dtype: DType = self
            .dtype
            .parse()
            .map_err(|_| DisaggError::InvalidRecord { field: "dtype", reason: format!("{:?} is not a known dtype", self.dtype) })?;
        Ok(KvLayout { num_layers: self.layers, num_kv_heads: self.kv_heads, head_dim: self.head_dim, block_size: self.block_size, dtype })
    }

    pub fn storage(&self) -> Result<KvStorage> {
        Ok(KvStorage::new(self.layout()?, self.num_blocks)?)
    }

    pub fn to_args(&self) -> Vec<String> {
        [
            ("--layers", self.layers.to_string()),
            ("--kv-heads", self.kv_heads.to_string()),
            ("--head-dim", self.head_dim.to_string()),
            ("--block-size", self.block_size.to_string()),
            ("--dtype", self.dtype.clone()),
            ("--num-blocks", self.num_blocks.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect()
    }
}

/// A block of one layer: (layer, block).
pub type LayerBlock = (u32, BlockId);

/// Fills every block with bytes derived from (seed, layer, block), so two
/// pools filled with different seeds differ everywhere.
pub fn fill_pool(storage: &mut KvStorage, seed: u64) -> Result<()> {
    let layout = *storage.layout();
    let mut buf = vec![0u8; layout.layer_block_bytes()];
    for layer in 0..layout.num_layers {
        for block in 0..storage.num_blocks() as BlockId {
            let mut x = seed ^ ((layer as u64) << 32 | block as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for chunk in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            storage.set_block_bytes(layer, block, &buf)?;
        }
    }
    Ok(())
}

/// BLAKE3 of the given (layer, block)s' bytes, concatenated in order.
pub fn hash_blocks(storage: &KvStorage, blocks: &[LayerBlock]) -> Result<String> {
    let mut h = blake3::Hasher::new();
    for &(layer, block) in blocks {
        if layer as usize >= storage.layout().num_layers || block as usize >= storage.num_blocks() {
            return Err(DisaggError::BlockOutOfRange {
                side: "hashed",
                layer,
                block,
                num_layers: storage.layout().num_layers,
                num_blocks: storage.num_blocks(),
            });
        }
        h.update(storage.block_bytes(layer as usize, block));
    }
    Ok(h.finalize().to_hex().to_string())
}

/// The source and destination sides of copies, as hashable block lists.
pub fn sides(copies: &[BlockCopy]) -> (Vec<LayerBlock>, Vec<LayerBlock>) {
    copies.iter().map(|c| ((c.layer, c.src), (c.layer, c.dst))).unzip()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum PeerCommand {
    /// Fill the peer's pool ([`fill_pool`]).
    Fill { seed: u64 },
    /// Hash these blocks of the peer's pool ([`hash_blocks`]).
    Hash { blocks: Vec<LayerBlock> },
    /// Write from the peer's pool into the coordinator's.
    Write { copies: Vec<BlockCopy>, timeout_ms: u64 },
    /// Free everything and exit.
    Exit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum PeerReply {
    Done,
    Hash { hex: String },
    Written { bytes: u64, ranges: usize, micros: u64 },
    Failed { error: String },
    Bye,
}

/// The peer process's main: pool, transport, handshake, then commands
/// until `Exit`. Errors end the process (the coordinator sees it exit).
pub fn run_peer(control: SocketAddr, spec: &PoolSpec) -> Result<()> {
    let mut storage = spec.storage()?;
    // SAFETY: `storage` is declared before `transport`, so it is dropped
    // after it.
    let memory = unsafe { PoolMemory::of_storage(&storage) }?;
    let transport = MooncakeTransport::new(&MooncakeConfig::default(), memory)?;
    let mut channel = ControlChannel::connect(control, Duration::from_secs(30))?;
    let remote = handshake::exchange(&mut channel, transport.local_record())?;
    // Opened on the first write: a peer that only receives never opens
    // the coordinator's segment.
    let mut peer = None;
    loop {
        let reply = match channel.recv::<PeerCommand>()? {
            PeerCommand::Fill { seed } => fill_pool(&mut storage, seed).map(|()| PeerReply::Done),
            PeerCommand::Hash { blocks } => hash_blocks(&storage, &blocks).map(|hex| PeerReply::Hash { hex }),
            PeerCommand::Write { copies, timeout_ms } => {
                if peer.is_none() {
                    peer = Some(transport.connect(&remote)?);
                }
                transport.write_blocks(peer.as_ref().unwrap(), &copies, Duration::from_millis(timeout_ms)).map(|r| PeerReply::Written {
                    bytes: r.bytes,
                    ranges: r.ranges,
                    micros: r.elapsed.as_micros() as u64,
                })
            }
            PeerCommand::Exit => {
                if let Some(peer) = peer.take() {
                    transport.disconnect(peer)?;
                }
                channel.send(&PeerReply::Bye)?;
                return Ok(());
            }
        };
        channel.send(&reply.unwrap_or_else(|e| PeerReply::Failed { error: e.to_string() }))?;
    }
}

/// The coordinator's handle on a spawned peer process. Dropping it kills
/// the process.
pub struct PeerProcess {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// Copies the child's stderr into `stderr` until the pipe closes.
    stderr_reader: Option<JoinHandle<()>>,
    pub channel: ControlChannel,
}

impl PeerProcess {
    /// Spawns `exe peer --control <addr> <spec>` and waits (at most
    /// `timeout`) for it to connect. The handshake is the caller's.
    pub fn spawn(exe: &Path, spec: &PoolSpec, timeout: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let mut child = Command::new(exe)
            .arg("peer")
            .arg("--control")
            .arg(addr.to_string())
            .args(spec.to_args())
            .env("GLOG_minloglevel", "1") // Mooncake's INFO lines are noise here
            .env("RUST_BACKTRACE", "0") // its error message, not a backtrace, ends its stderr
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let channel = ControlChannel::accept(&listener, timeout, || match child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(DisaggError::Control(format!("the peer process exited ({status}) before connecting:\n{}", tail(&stderr)))),
        });
        match channel {
            Ok(channel) => Ok(Self { child, stderr, stderr_reader: Some(stderr_reader), channel }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command and returns the peer's reply.
    pub fn command(&mut self, cmd: &PeerCommand) -> Result<PeerReply> {
        self.channel.send(cmd)?;
        self.channel.recv()
    }

    /// Waits for the process to exit, at most `timeout`; everything it
    /// wrote to stderr is then in [`Self::stderr_tail`].
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(500);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if let Some(reader) = self.stderr_reader.take() {
                    let _ = reader.join(); // the pipe closed with the process
                }
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(DisaggError::Control(format!("the peer process did not exit within {timeout:?}")));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines the peer wrote to stderr (for failure messages).
    pub fn stderr_tail(&self) -> String {
        tail(&self.stderr)
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tail(buf: &Mutex<String>) -> String {
    let s = buf.lock().unwrap_or_else(|p| p.into_inner());
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PoolSpec {
        PoolSpec { layers: 2, kv_heads: 1, head_dim: 8, block_size: 2, dtype: "f16".into(), num_blocks: 4 }
    }

    #[test]
    fn fill_depends_on_seed_layer_and_block() {
        let (mut a, mut b) = (spec().storage().unwrap(), spec().storage().unwrap());
        fill_pool(&mut a, 1).unwrap();
        fill_pool(&mut b, 1).unwrap();
        let all: Vec<(u32, u32)> = (0..2).flat_map(|l| (0..4).map(move |b| (l, b))).collect();
        assert_eq!(hash_blocks(&a, &all).unwrap(), hash_blocks(&b, &all).unwrap());
        fill_pool(&mut b, 2).unwrap();
        assert_ne!(hash_blocks(&a, &all).unwrap(), hash_blocks(&b, &all).unwrap());
        assert_ne!(a.block_bytes(0, 0), a.block_bytes(0, 1));
        assert_ne!(a.block_bytes(0, 0), a.block_bytes(1, 0));
    }

    #[test]
    fn pool_spec_round_trips_through_its_flags() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            pool: PoolSpec,
        }
        let args = std::iter::once("x".to_string()).chain(spec().to_args());
        let cli = <Cli as clap::Parser>::parse_from(args);
        assert_eq!(cli.pool, spec());
    }
}
