//! The commands an [`crate::EngineHandle`] sends to the step loop, and the
//! plain data they carry (where a submission's prompt KV comes from, what a
//! reservation, snapshot reserve or prefix-cache reset answers). Depends on
//! no part of the engine but its request and error types: the loop, the
//! handle and [`crate::kv_handoff`] all depend on it.

use kvc_kv_pool::BlockId;
use tokio::sync::{mpsc, oneshot};

use crate::{EngineError, GenerateRequest, Logprobs, StreamEvent};

pub(crate) enum Command {
    Submit {
        seq_id: u64,
        req: GenerateRequest,
        tx: mpsc::UnboundedSender<StreamEvent>,
        kv: SubmitKv,
    },
    /// Requests admitted together, in one step's scheduling (the `n`
    /// choices of one prompt: their batches then do not depend on when
    /// each submission reached the loop).
    SubmitGroup(Vec<(u64, GenerateRequest, mpsc::UnboundedSender<StreamEvent>)>),
    Cancel(u64),
    /// Reserve a prompt's blocks (decode worker, before a remote prefill).
    Reserve {
        id: u64,
        session: Option<String>,
        cache_salt: Option<String>,
        prompt: Vec<u32>,
        reply: oneshot::Sender<Result<Reserved, EngineError>>,
    },
    ReleaseReservation(u64),
    ReleaseLease(u64),
    /// Snapshot store (prefill worker): set blocks aside for a push.
    SnapshotReserve {
        session: String,
        tokens: Vec<u32>,
        reply: oneshot::Sender<Result<SnapshotSlot, EngineError>>,
    },
    SnapshotCommit {
        reservation: u64,
        reply: oneshot::Sender<Result<usize, EngineError>>,
    },
    SnapshotAbort(u64),
    /// A snapshot push (decode worker) ended: the pushed tokens, or None.
    SnapshotPushed {
        session: String,
        ok: bool,
    },
    DeleteSession(String, oneshot::Sender<bool>),
    ResetPrefixCache(oneshot::Sender<PrefixCacheReset>),
    Shutdown,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::ReleaseReservation(id) => write!(f, "ReleaseReservation({id})"),
            Command::ReleaseLease(id) => write!(f, "ReleaseLease({id})"),
            _ => f.write_str("Command"),
        }
    }
}

impl From<crate::kv_handoff::LeaseReleased> for Command {
    fn from(l: crate::kv_handoff::LeaseReleased) -> Self {
        Command::ReleaseLease(l.0)
    }
}

/// Where a submitted sequence's prompt KV comes from.
#[derive(Debug)]
pub(crate) enum SubmitKv {
    /// Computed here, reusing what the caches hold.
    Compute,
    /// Computed here (prefill worker); after the first token the prompt's
    /// blocks are leased to the caller for transfer.
    Export,
    /// From a reservation: its first `computed` tokens have KV; with
    /// `first`, the prompt is complete and its first token was sampled by
    /// a peer.
    Reserved { id: u64, computed: usize, first: Option<(u32, Option<Logprobs>)> },
}

/// What a reservation answers.
#[derive(Debug)]
pub(crate) struct Reserved {
    pub held_tokens: usize,
    pub reuse_reason: kvc_session_cache::ReusePath,
    pub restored_blocks: usize,
    pub blocks: Vec<BlockId>,
}

/// Blocks the prefill worker's snapshot store set aside for a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSlot {
    pub reservation: u64,
    /// Blocks before this one the store already holds.
    pub from_block: usize,
    /// Where blocks `from_block..` go.
    pub blocks: Vec<BlockId>,
}

/// What `reset_prefix_cache` did: blocks dropped from the prefix index,
/// blocks that became free by it (fewer when sessions, running requests or
/// a prefill worker's snapshot store still hold some), and the blocks the
/// snapshot store keeps (a reset leaves it alone; deleting a session
/// removes its snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheReset {
    pub index_blocks: usize,
    pub freed_blocks: usize,
    pub snapshot_blocks: usize,
}
