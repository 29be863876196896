//! The decode worker's component of the loop: which sessions to push to a
//! prefill worker after a turn, and what each last pushed. Absent on the
//! other roles (`EngineLoop::pushes` is None).

use std::collections::HashMap;

use kvc_session_cache::BlockHash;
use tokio::sync::mpsc;

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

    /// Of a session's full blocks (their hashes, `block_size` tokens each),
    /// how many its last push already holds; None when no push is due
    /// (one is in flight, or too few tokens are new).
    pub(super) fn due(&self, session: &str, hashes: &[BlockHash], block_size: usize) -> Option<usize> {
        if self.pushing.contains_key(session) {
            return None;
        }
        let same = self.pushed.get(session).map_or(0, |p| p.iter().zip(hashes).take_while(|(a, b)| a == b).count());
        ((hashes.len() - same) * block_size >= self.min_tokens).then_some(same)
    }

    /// Hands `job` to the pusher; false if it is gone.
    pub(super) fn send(&mut self, job: SnapshotJob, hashes: Vec<BlockHash>) -> bool {
        let session = job.session_id.clone();
        if self.jobs.send(job).is_err() {
            return false;
        }
        self.pushing.insert(session, hashes);
        true
    }

    /// A push ended; `ok` and the session still kept: it becomes the
    /// session's last push.
    pub(super) fn finished(&mut self, session: String, ok: bool, session_kept: bool) {
        if let Some(hashes) = self.pushing.remove(&session) {
            if ok && session_kept {
                self.pushed.insert(session, hashes);
            }
        }
    }
}
