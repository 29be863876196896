//! The decode worker's part of the loop: which sessions to push to a
//! prefill worker after a turn, and what each last pushed. Absent on the
//! other roles and when `snapshot_min_tokens` is 0.

use std::collections::HashMap;

use kvc_kv_pool::BlockId;
use kvc_policy::snapshot_push::{decide_snapshot_push, SnapshotPushInputs, SnapshotPushReason};
use kvc_session_cache::{hash_blocks, BlockHash};
use tokio::sync::mpsc;

use super::role_parts::{Ctx, RolePart};
use crate::command::Command;
use crate::kv_handoff::SnapshotJob;

pub(super) struct SnapshotPushes {
    jobs: mpsc::UnboundedSender<SnapshotJob>,
    /// Push once at least this many tokens are not yet snapshotted.
    min_tokens: usize,
    /// Block hashes of what each session last pushed, and pushes in flight.
    pushed: HashMap<String, Vec<BlockHash>>,
    pushing: HashMap<String, Vec<BlockHash>>,
}

impl SnapshotPushes {
    /// None when there is no pusher or pushes are off (`min_tokens` 0).
    pub(super) fn new(jobs: Option<mpsc::UnboundedSender<SnapshotJob>>, min_tokens: usize) -> Option<Self> {
        let jobs = jobs.filter(|_| min_tokens > 0)?;
        Some(Self { jobs, min_tokens, pushed: HashMap::new(), pushing: HashMap::new() })
    }

    /// [`Self::new`] as the loop's role part.
    pub(super) fn part(jobs: Option<mpsc::UnboundedSender<SnapshotJob>>, min_tokens: usize) -> Option<Box<dyn RolePart>> {
        Self::new(jobs, min_tokens).map(|p| Box::new(p) as Box<dyn RolePart>)
    }

    /// Of a session's full blocks (their hashes, `block_size` tokens each),
    /// how many its last push already holds; None when no push is due
    /// (one is in flight, or too few tokens are new).
    /// The view gathered here, the decision [`decide_snapshot_push`]'s.
    fn due(&self, session: &str, hashes: &[BlockHash], block_size: usize) -> Option<usize> {
        let same = self.pushed.get(session).map_or(0, |p| p.iter().zip(hashes).take_while(|(a, b)| a == b).count());
        let d = decide_snapshot_push(&SnapshotPushInputs {
            in_flight: self.pushing.contains_key(session),
            blocks: hashes.len(),
            pushed_blocks: same,
            block_size,
            min_tokens: self.min_tokens,
        });
        kvc_policy::log_decision(&d);
        (d.reason == SnapshotPushReason::NewTokens).then_some(same)
    }

    /// Hands `job` to the pusher; false if it is gone.
    fn send(&mut self, job: SnapshotJob, hashes: Vec<BlockHash>) -> bool {
        let session = job.session_id.clone();
        if self.jobs.send(job).is_err() {
            return false;
        }
        self.pushing.insert(session, hashes);
        true
    }

    /// A push ended; `ok` and the session still kept: it becomes the
    /// session's last push.
    fn finished(&mut self, session: String, ok: bool, session_kept: bool) {
        if let Some(hashes) = self.pushing.remove(&session) {
            if ok && session_kept {
                self.pushed.insert(session, hashes);
            }
        }
    }
}

impl RolePart for SnapshotPushes {
    /// Queues a push of the session's full blocks when enough of them are
    /// not yet snapshotted.
    fn committed(&mut self, session: &str, tokens: &[u32], blocks: &[BlockId], ctx: Ctx<'_>) -> bool {
        let bs = ctx.storage.layout().block_size;
        let full = (tokens.len() / bs).min(blocks.len());
        let hashes = hash_blocks(&tokens[..full * bs], bs);
        let Some(same) = self.due(session, &hashes, bs) else {
            return false;
        };
        let lease = ctx.leases.lease(blocks[..full].to_vec(), Some(session.to_string()), ctx.alloc);
        let job = SnapshotJob { session_id: session.to_string(), tokens: tokens[..full * bs].to_vec(), lease };
        if !self.send(job, hashes) {
            return false;
        }
        tracing::info!(event = "snapshot_push_enqueued", session, blocks = full, new_blocks = full - same);
        true
    }

    fn takes(&self, cmd: &Command) -> bool {
        matches!(cmd, Command::SnapshotPushed { .. })
    }

    fn on_command(&mut self, cmd: Command, ctx: Ctx<'_>) -> bool {
        if let Command::SnapshotPushed { session, ok } = cmd {
            let kept = ctx.cache.session_info(&session).is_some();
            self.finished(session, ok, kept);
        }
        false
    }
}
