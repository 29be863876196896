//! The engine loop's side of KV handoff ([`crate::kv_handoff`] holds the
//! types callers see; docs/disaggregation.md the protocol): reservations
//! for remote prefills and leases on blocks being transferred, which any
//! engine keeps; the snapshot commands go to the role's part
//! (`role_parts.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};

use kvc_kv_pool::{BlockAllocator, BlockId};
use kvc_scheduler::SeqId;

use super::EngineLoop;
use crate::command::{Command, Reserved};
use crate::kv_handoff::KvLease;
use crate::EngineError;

/// A reservation waiting for its submission.
pub(super) struct ReservationState {
    pub(super) session: Option<String>,
    pub(super) blocks: Vec<BlockId>,
    pub(super) held: usize,
    pub(super) reason: kvc_session_cache::ReusePath,
    pub(super) restored: usize,
}

/// Blocks held for a transfer out of the pool.
struct LeaseState {
    blocks: Vec<BlockId>,
    /// The session the blocks belong to (snapshot pushes).
    session: Option<String>,
    revoked: Arc<AtomicBool>,
}

/// KV that enters or leaves the pool by transfer: reservations waiting for
/// their submission (decode worker) and leases on blocks being sent (a
/// prefill worker's exports, a decode worker's pushes). Both stay empty on
/// role `both`; any engine answers their commands.
pub(super) struct Handoff {
    pub(super) reservations: HashMap<u64, ReservationState>,
    pub(super) leases: Leases,
}

impl Handoff {
    /// `commands` is the loop's own channel: a lease dropped by its holder
    /// sends its release there.
    pub(super) fn new(commands: std_mpsc::Sender<Command>) -> Self {
        Self { reservations: HashMap::new(), leases: Leases { commands, held: HashMap::new(), next: 1 } }
    }
}

/// Leases on blocks held for transfers out of the pool.
pub(super) struct Leases {
    commands: std_mpsc::Sender<Command>,
    held: HashMap<u64, LeaseState>,
    next: u64,
}

impl Leases {
    /// A lease on `blocks` (new references, released with the lease).
    pub(super) fn lease(&mut self, blocks: Vec<BlockId>, session: Option<String>, alloc: &mut BlockAllocator) -> KvLease {
        for &b in &blocks {
            alloc.incref(b);
        }
        let id = self.next;
        self.next += 1;
        let revoked = Arc::new(AtomicBool::new(false));
        self.held.insert(id, LeaseState { blocks: blocks.clone(), session, revoked: revoked.clone() });
        KvLease::new(id, blocks, revoked, self.commands.clone())
    }

    fn release(&mut self, id: u64, alloc: &mut BlockAllocator) {
        if let Some(l) = self.held.remove(&id) {
            alloc.free_all(&l.blocks);
        }
    }

    /// Marks the leases of released sessions: their pushes are abandoned.
    pub(super) fn revoke_sessions(&self, released: impl Fn(&str) -> bool) {
        for l in self.held.values() {
            if l.session.as_deref().is_some_and(&released) && !l.revoked.swap(true, Ordering::AcqRel) {
                tracing::info!(event = "snapshot_push_revoked", session = ?l.session, "session released during its snapshot push");
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Blocks under lease (counted once per lease).
    pub(super) fn held_blocks(&self) -> usize {
        self.held.values().map(|l| l.blocks.len()).sum()
    }
}

impl EngineLoop {
    /// Reservation and lease commands here; the role's own (snapshot
    /// store, snapshot pushes) to its part.
    pub(super) fn handle_handoff(&mut self, cmd: Command) {
        match cmd {
            Command::Reserve { id, session, cache_salt, prompt, reply } => {
                let _ = reply.send(self.reserve(id, session, cache_salt.as_deref(), &prompt));
                self.publish();
            }
            Command::ReleaseReservation(id) => {
                if let Some(r) = self.handoff.reservations.remove(&id) {
                    self.allocator.free_all(&r.blocks);
                    if let Some(s) = r.session {
                        self.cache.abandon(&s);
                    }
                }
            }
            Command::ReleaseLease(id) => self.handoff.leases.release(id, &mut self.allocator),
            cmd => {
                if self.with_parts(|parts, ctx| parts.on_command(cmd, ctx)) {
                    self.publish();
                }
            }
        }
    }

    /// Reserves a prompt's blocks: those the caches hold for it, and fresh
    /// ones for the rest.
    fn reserve(&mut self, id: u64, session: Option<String>, cache_salt: Option<&str>, prompt: &[u32]) -> Result<Reserved, EngineError> {
        let bs = self.block_size();
        let root = cache_salt.map(kvc_session_cache::salt_root);
        let got = self.cache.acquire(session.as_deref(), prompt, root, &mut self.allocator, &mut self.storage);
        let need = prompt.len().div_ceil(bs) - got.blocks.len();
        let Some(fresh) = self.cache.allocate(need, &mut self.allocator, &self.storage) else {
            // Nothing of the acquire stays: neither the blocks, nor the
            // session's busy mark, nor its counts.
            self.allocator.free_all(&got.blocks);
            self.cache.give_back(session.as_deref(), got.source, got.tokens, prompt.len());
            return Err(EngineError::NoKvRoom(format!("{need} free blocks needed for the prompt, {} free", self.allocator.num_free())));
        };
        // A prefill worker writes the fresh blocks over the transport: copies
        // out of them (an offload that just freed them) must end first;
        // other copies (a write-back batch) run on.
        self.cache.wait_host_copies(&fresh);
        let mut blocks = got.blocks;
        blocks.extend(fresh);
        let reason = got.source;
        self.handoff
            .reservations
            .insert(id, ReservationState { session, blocks: blocks.clone(), held: got.tokens, reason, restored: got.restored_blocks });
        Ok(Reserved { held_tokens: got.tokens, reuse_reason: reason, restored_blocks: got.restored_blocks, blocks })
    }

    /// Prefill worker: leases a finished export's prompt blocks to the
    /// caller (and offers them to the role's snapshot store).
    pub(super) fn export_prompt(&mut self, id: SeqId) -> Option<KvLease> {
        let a = self.active.get(&id).filter(|a| a.export)?;
        let seq = self.scheduler.get(id)?;
        let n = a.prompt_len;
        if seq.num_computed < n {
            return None;
        }
        let blocks = seq.block_table[..n.div_ceil(self.block_size())].to_vec();
        if let Some(s) = a.snapshot_session.as_deref() {
            self.parts.exported(s, &seq.tokens[..n], &blocks, &mut self.allocator, &self.storage);
        }
        Some(self.handoff.leases.lease(blocks, None, &mut self.allocator))
    }
}
