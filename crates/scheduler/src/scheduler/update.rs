//! After a step: the bookkeeping of what it computed and sampled
//! ([`Scheduler::update`], vLLM's `update_from_output`), called by the
//! engine once per step.

use super::{Schedule, Scheduler};
use crate::sequence::{SeqId, Sequence};

impl Scheduler {
    /// Records a step that ran `plan`: every chunk's tokens now have KV in
    /// the pool, and each sequence in `sampled` gets its token appended.
    /// Returns those of them that reached their token limit
    /// ([`Sequence::at_token_limit`]): the caller finishes them (with
    /// `length`, unless a stop condition came first) and removes them, as
    /// the final answer and the session's commit are its own.
    pub fn update(&mut self, plan: &Schedule, sampled: &[(SeqId, u32)]) -> Vec<SeqId> {
        for c in &plan.chunks {
            self.mark_computed(c.seq_id, c.len);
        }
        let mut at_limit = Vec::new();
        for &(id, token) in sampled {
            self.append_token(id, token);
            if self.seqs.get(&id).is_some_and(Sequence::at_token_limit) {
                at_limit.push(id);
            }
        }
        at_limit
    }
}
