//! Continuous batching with chunked prefill, KV-aware admission and fair
//! long prefills (see scheduler.rs for the planner and its bounds).
//!
//! Each step: every decode, then admissions (a waiting prompt is admitted
//! only when all its blocks and a reserve for the running sequences'
//! growth fit), then prefill chunks, short prompts before long ones,
//! within the step's prefill budget. When a running sequence needs a block
//! and none is left after reclaiming caches, the running sequence whose
//! loss wastes least is preempted and recomputed later.

mod config;
mod kv_manager;
mod scheduler;
mod sequence;
mod step_budget;

pub use config::{SchedulerConfig, DEFAULT_GROWTH_RESERVE_TOKENS, DEFAULT_MAX_HEAD_OF_LINE_STEPS};
// The scheduler's decisions live in kvc-policy (issue 32); re-exported
// under their old names so callers keep compiling.
pub use kv_manager::KvManager;
pub use kvc_policy::preemption::{
    decide_preemption as choose_victim, PreemptionCandidate, PreemptionCandidate as VictimCandidate, PreemptionDecision, PreemptionReason,
};
pub use kvc_policy::seq_admission::{decide_seq_admission as decide_admission, AdmitInputs, AdmitReason, Wait};
pub use scheduler::{Schedule, ScheduledChunk, Scheduler, SchedulerStats};
pub use sequence::{SeqId, SeqStatus, Sequence};
pub use step_budget::{ChunkCost, StepBudget, TimeBudget};
