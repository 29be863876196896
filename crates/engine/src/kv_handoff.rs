//! KV that leaves or enters the engine's pool by transfer rather than by
//! the model (prefill/decode disaggregation, docs/disaggregation.md):
//!
//! - [`Reservation`] (decode worker): the blocks of a prompt, reserved
//!   before anything computes them: the ones the worker already holds
//!   (session or prefix cache) and fresh ones for a peer to fill. Submitted
//!   with [`crate::EngineHandle::submit_reserved`]; dropped unsubmitted,
//!   its blocks go back.
//! - [`KvLease`]: references on blocks held for a transfer out of the pool
//!   (a remote prefill's prompt on the prefill worker, a session snapshot
//!   push on the decode worker). Dropping the last clone gives them back.
//! - [`SnapshotJob`] (decode worker): a committed turn's session blocks to
//!   push to a prefill worker.
//! - [`SnapshotSlot`](crate::SnapshotSlot) (prefill worker): blocks the
//!   snapshot store set aside for a push (a command's reply, in `command.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};

use kvc_kv_pool::BlockId;

/// Blocks reserved for a prompt on a decode worker.
#[derive(Debug)]
pub struct Reservation {
    pub(crate) id: u64,
    /// Leading prompt tokens whose KV the reserved blocks already hold
    /// (whole blocks).
    pub held_tokens: usize,
    /// Where the held tokens came from.
    pub reuse_reason: crate::ReusePath,
    pub restored_blocks: usize,
    /// One block per `block_size` prompt tokens, in order.
    pub blocks: Vec<BlockId>,
    pub(crate) release: ReleaseOnDrop,
}

impl Reservation {
    /// The blocks after the held ones: what a peer must fill.
    pub fn blocks_to_fill(&self, block_size: usize) -> &[BlockId] {
        &self.blocks[self.held_tokens / block_size..]
    }
}

/// Sends a release command when dropped, unless disarmed. Generic over
/// the command type (the loop's `Command`), so this file does not import
/// the command vocabulary that carries its leases.
#[derive(Debug)]
pub(crate) struct ReleaseOnDrop {
    pub(crate) command: Option<Box<dyn Release>>,
}

/// A command and the channel it goes to, sent once.
pub(crate) trait Release: std::fmt::Debug + Send + Sync {
    fn send(self: Box<Self>);
}

impl<C: std::fmt::Debug + Send + Sync + 'static> Release for (std_mpsc::Sender<C>, C) {
    fn send(self: Box<Self>) {
        let (tx, cmd) = *self;
        let _ = tx.send(cmd);
    }
}

/// The release of lease `.0`, as the command the lease's channel carries
/// (`Command::ReleaseLease`).
pub(crate) struct LeaseReleased(pub(crate) u64);

impl ReleaseOnDrop {
    pub(crate) fn new<C: std::fmt::Debug + Send + Sync + 'static>(commands: std_mpsc::Sender<C>, command: C) -> Self {
        Self { command: Some(Box::new((commands, command))) }
    }

    pub(crate) fn disarm(&mut self) {
        self.command = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(release) = self.command.take() {
            release.send();
        }
    }
}

/// References on blocks held for a transfer out of the pool.
#[derive(Debug, Clone)]
pub struct KvLease {
    inner: Arc<LeaseInner>,
}

#[derive(Debug)]
struct LeaseInner {
    id: u64,
    blocks: Vec<BlockId>,
    revoked: Arc<AtomicBool>,
    _release: ReleaseOnDrop,
}

impl KvLease {
    pub(crate) fn new<C>(id: u64, blocks: Vec<BlockId>, revoked: Arc<AtomicBool>, commands: std_mpsc::Sender<C>) -> Self
    where
        C: From<LeaseReleased> + std::fmt::Debug + Send + Sync + 'static,
    {
        let release = ReleaseOnDrop::new(commands, C::from(LeaseReleased(id)));
        Self { inner: Arc::new(LeaseInner { id, blocks, revoked, _release: release }) }
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub fn blocks(&self) -> &[BlockId] {
        &self.inner.blocks
    }

    /// True once what the blocks belong to was released (the session was
    /// deleted or dropped): a push of them must be abandoned.
    pub fn is_revoked(&self) -> bool {
        self.inner.revoked.load(Ordering::Acquire)
    }
}

impl PartialEq for KvLease {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}

/// A committed turn's session KV to push to a prefill worker.
#[derive(Debug)]
pub struct SnapshotJob {
    pub session_id: String,
    /// The tokens the blocks hold (a whole number of blocks).
    pub tokens: Vec<u32>,
    /// Holds `blocks` for the push.
    pub lease: KvLease,
}
