//! Continuous batching with chunked prefill.
//!
//! Each step: running sequences first (decodes and unfinished prefill
//! chunks, oldest first), then waiting sequences, within a token budget
//! (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`). When the
//! pool has no block for a running sequence, the newest running sequence is
//! preempted: its blocks are freed and it is recomputed later from its
//! prompt plus what it has generated, so nothing fails for lack of memory.

mod scheduler;
mod sequence;

pub use scheduler::{NoCache, Schedule, ScheduledChunk, Scheduler, SchedulerConfig, SchedulerHooks};
pub use sequence::{SeqId, SeqStatus, Sequence};
