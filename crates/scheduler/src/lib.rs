//! Continuous batching with chunked prefill, KV-aware admission and fair
//! long prefills (see scheduler.rs for the planner and its bounds).
//!
//! Each step: every decode, then admissions (a waiting prompt is admitted
//! only when all its blocks and a reserve for the running sequences'
//! growth fit), then prefill chunks, short prompts before long ones,
//! within the step's prefill budget. When a running sequence needs a block
//! and none is left after reclaiming caches, the running sequence whose
//! loss wastes least is preempted and recomputed later.

mod budget;
mod config;
mod policy;
mod scheduler;
mod sequence;

pub use budget::{ChunkCost, TimeBudget};
pub use config::{SchedulerConfig, DEFAULT_GROWTH_RESERVE_TOKENS, DEFAULT_MAX_HEAD_OF_LINE_STEPS};
pub use policy::{choose_victim, decide_admission, AdmitInputs, AdmitReason, VictimCandidate, Wait};
pub use scheduler::{NoCache, Schedule, ScheduledChunk, Scheduler, SchedulerHooks, SchedulerStats};
pub use sequence::{SeqId, SeqStatus, Sequence};
