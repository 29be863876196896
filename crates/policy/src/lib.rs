//! The one house for decisions (issue 32): pure decision functions and the
//! rules they share, depending on nothing but `kvc-wire`. No I/O, no
//! clocks, no locks: a caller gathers the inputs, a function here decides
//! and returns the decision with a typed reason (an enum whose label sets
//! are closed, so its counter is exported at 0 from the start), and every
//! place that estimates the same thing calls the same rule instead of
//! writing it again.
//!
//! It holds:
//! - [`seq_admission`]: whether the scheduler admits the next waiting
//!   sequence in a step, by [`seq_admission::decide_seq_admission`];
//! - [`preemption`]: which running sequence the scheduler preempts when one
//!   needs a block and no cache is left to reclaim, by
//!   [`preemption::decide_preemption`];
//! - [`eviction`]: which idle session loses its device blocks, offloaded to
//!   the host tier or dropped, by [`eviction::decide_eviction`];
//! - [`write_back`]: whether (and how many) idle sessions' blocks are copied
//!   to the host tier ahead of pressure, by [`write_back::decide_write_back`];
//! - [`prefill_path`]: where a decode worker computes a prompt suffix
//!   (here, or on a prefill worker), by [`prefill_path::decide`];
//! - [`prefill_fallback`]: where it computes one whose remote prefill
//!   failed, by [`prefill_fallback::decide_fallback`];
//! - [`prefill_peer`]: which prefill worker a decode worker asks, by
//!   [`prefill_peer::choose_peer`];
//! - [`spill`]: how a prefill worker's snapshot store makes room (demote,
//!   drop colder host KV, drop), by [`spill::decide_spill`];
//! - [`step_kind`]: whether an engine step carries prefill beside its
//!   decodes or runs them alone (`--itl-target-ms`), by
//!   [`step_kind::decide_step_kind`];
//! - [`step_budget`]: whether an engine step gets a time budget for its
//!   prefill chunks (`--max-step-ms`), and why not, by
//!   [`step_budget::decide_step_budget`];
//! - [`queue_delay`]: whether a worker takes a new prompt or answers 429
//!   because it would wait past `--max-queue-delay-s` behind the queued
//!   prefill, by [`queue_delay::decide_queue_delay`], over the backlog's
//!   [`DrainRate`];
//! - [`kernel_plan`]: which GPU kernels run the forward passes (the
//!   environment's request resolved against the device, once at load), by
//!   [`kernel_plan::decide_kernel_plan`];
//! - [`fp8_attention`]: whether a step's prefill attention over an FP8 KV
//!   cache runs cuDNN's FP8 graph, by [`fp8_attention::decide_fp8_attention`];
//! - [`reusable_tokens`]: how much of a prompt a worker's resident KV spares
//!   (engine admission, router placement, the prefill-path cost function);
//! - [`Ewma`]: the moving average of measured rates and costs (prefill
//!   tokens/s, KV transfer bandwidth, a remote prefill's overhead).
//!
//! - [`admission_probe`]: whether the engine can take a turn now (`POST
//!   /admission`), by [`admission_probe::decide_admission_probe`];
//! - [`host_drop`]: which idle session loses its host KV when the host
//!   tier is full, by [`host_drop::decide_host_drop`];
//! - [`snapshot_push`]: whether a decode worker pushes a session's
//!   snapshot after a turn, by [`snapshot_push::decide_snapshot_push`];
//! - [`session_cap`]: which idle session of a key makes room for its new
//!   one under `--max-sessions-per-key`, by
//!   [`session_cap::decide_session_cap`];
//! - [`route_score`]: where the router places a request, by
//!   [`route_score::choose_worker`] over one score per worker.
//! - [`reuse`]: where a request's reused KV comes from at admission (the
//!   session cache's answer, a snapshot, nothing), by [`reuse::decide_reuse`].
//!
//! Every reason implements [`decision::Reason`]; callers log what they act
//! on through [`decisions_total::log_decision`], which counts it in
//! `kvc_decisions_total{decision,outcome,reason}` (label sets closed:
//! [`decisions_total::label_sets`]).

pub mod admission_probe;
pub mod decision;
pub mod decisions_total;
mod drain_rate;
pub mod eviction;
mod ewma;
pub mod fp8_attention;
pub mod host_drop;
pub mod kernel_plan;
pub mod preemption;
pub mod prefill_fallback;
pub mod prefill_path;
pub mod prefill_peer;
pub mod queue_delay;
mod reusable_tokens;
pub mod reuse;
pub mod route_score;
pub mod seq_admission;
pub mod session_cap;
pub mod snapshot_push;
pub mod spill;
pub mod step_budget;
pub mod step_kind;
pub mod write_back;

pub use decision::{Decision, Reason};
pub use decisions_total::log_decision;
pub use drain_rate::DrainRate;
pub use ewma::Ewma;
pub use reusable_tokens::reusable_tokens;
