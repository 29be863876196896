//! `--max-queue-delay-s` at the door: the server gathers the engine's
//! backlog and drain rate, [`kvc_policy::queue_delay::decide_queue_delay`]
//! decides, and this logs the decision, counts it and turns a refusal into
//! a 429 with `Retry-After`.

use kvc_policy::queue_delay::{decide_queue_delay, QueueDelayInputs, QueueDelayReason};

use kvc_engine::EngineHandle;

use crate::error::ApiError;

/// Takes the prompts of one request about to be handed to `engine`, or
/// refuses them when they would wait past `max_queue_delay_s`.
pub fn check(engine: &EngineHandle, max_queue_delay_s: Option<f64>, request_id: &str) -> Result<(), ApiError> {
    let inputs = match max_queue_delay_s {
        // Off: nothing to gather.
        None => QueueDelayInputs { max_queue_delay_s: None, backlog_tokens: 0, drain_tokens_per_s: 0.0 },
        Some(bound) => QueueDelayInputs {
            max_queue_delay_s: Some(bound),
            backlog_tokens: engine.pending_prefill_tokens(),
            drain_tokens_per_s: engine.snapshot().backlog_drain_tokens_per_s,
        },
    };
    let d = decide_queue_delay(&inputs);
    kvc_policy::log_decision(&d.decision());
    if d.reason == QueueDelayReason::NoBound {
        return Ok(());
    }
    let wait_s = d.estimated_wait_s.unwrap_or(0.0);
    tracing::debug!(
        event = "queue_delay",
        request_id,
        decision = d.reason.decision(),
        reason = d.reason.as_str(),
        backlog_tokens = inputs.backlog_tokens,
        drain_tokens_per_s = inputs.drain_tokens_per_s,
        wait_s,
        retry_after_s = d.retry_after_s,
    );
    if d.admit {
        return Ok(());
    }
    Err(ApiError::QueueDelay { wait_s, bound_s: inputs.max_queue_delay_s.unwrap_or(0.0), retry_after_s: d.retry_after_s })
}
