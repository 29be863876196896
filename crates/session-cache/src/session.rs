//! One session's committed KV: its tokens and where each block lives.

use std::time::Instant;

use kvc_kv_pool::BlockId;
use serde::Serialize;

use crate::host_tier::HostBlockId;

/// Where one block of a session lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLoc {
    Device(BlockId),
    Host(HostBlockId),
}

#[derive(Debug, Clone)]
pub struct Session {
    /// Tokens whose KV the session holds (prompt + output of its last turn,
    /// minus the final sampled token, whose KV was never computed).
    pub tokens: Vec<u32>,
    /// Blocks covering `tokens`, in order.
    pub blocks: Vec<BlockLoc>,
    pub last_use: Instant,
    pub turns: u32,
    /// A turn of this session is in flight.
    pub busy: u32,
}

/// Where a session's KV is, for `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Device,
    Host,
    /// Some blocks on the device, some in host memory.
    Mixed,
    /// The session is known but holds no KV (dropped under pressure).
    None,
}

/// A published view of one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub resident_tokens: usize,
    pub device_blocks: usize,
    pub host_blocks: usize,
    pub tier: Tier,
    pub turns: u32,
    /// When it was last used (its idle time is read off this, so that a
    /// published view stays right without being republished).
    #[serde(skip)]
    pub last_use: Instant,
    pub busy: bool,
}

impl Tier {
    /// The name the JSON views use.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Mixed => "mixed",
            Tier::None => "none",
        }
    }
}

impl SessionInfo {
    /// Seconds since the session was last used.
    pub fn idle_s(&self) -> f64 {
        self.last_use.elapsed().as_secs_f64()
    }
}

impl Session {
    pub fn new() -> Self {
        Self { tokens: Vec::new(), blocks: Vec::new(), last_use: Instant::now(), turns: 0, busy: 0 }
    }

    pub fn tier(&self) -> Tier {
        let dev = self.device_blocks();
        match (dev, self.blocks.len() - dev) {
            (0, 0) => Tier::None,
            (_, 0) => Tier::Device,
            (0, _) => Tier::Host,
            _ => Tier::Mixed,
        }
    }

    pub fn device_blocks(&self) -> usize {
        self.blocks.iter().filter(|b| matches!(b, BlockLoc::Device(_))).count()
    }

    pub fn info(&self, id: &str) -> SessionInfo {
        let dev = self.device_blocks();
        SessionInfo {
            id: id.to_string(),
            resident_tokens: self.tokens.len(),
            device_blocks: dev,
            host_blocks: self.blocks.len() - dev,
            tier: self.tier(),
            turns: self.turns,
            last_use: self.last_use,
            busy: self.busy > 0,
        }
    }
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

/// Length of the longest common prefix.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
