//! A request's state in the step loop that the scheduler does not know
//! about: its event channel, sampler, detokenizer, stop matcher, cache
//! answer and waits.

use std::time::{Duration, Instant};

use kvc_session_cache::{BlockHash, ReusePath};
use kvc_text_front::constrained::ConstraintState;
use kvc_text_front::detokenizer::IncrementalDecoder;
use kvc_text_front::stop::{StopMatcher, StopOutcome};
use tokio::sync::mpsc;

use super::prompt_logprobs;
use crate::sampler::Sampler;
use crate::StreamEvent;

/// Per-request state the scheduler does not know about.
pub(super) struct Active {
    pub(super) tx: mpsc::UnboundedSender<StreamEvent>,
    pub(super) sampler: Sampler,
    pub(super) decoder: IncrementalDecoder,
    pub(super) stop: StopMatcher,
    pub(super) stop_token_ids: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) session_id: Option<String>,
    /// The session's busy mark was taken (released by commit or abandon).
    pub(super) turn_open: bool,
    pub(super) cached_tokens: usize,
    pub(super) reuse_reason: ReusePath,
    /// The session cache's own answer to the last acquire (where the
    /// reuse came from, tokens): undone if the request gives it back.
    pub(super) cache_answer: Option<(ReusePath, usize)>,
    pub(super) restored_blocks: usize,
    /// Its restored blocks are being copied in beside other work: it
    /// computes nothing until this batch of copies is done.
    pub(super) restore_ticket: Option<kvc_kv_pool::CopyTicket>,
    /// Full blocks already offered to the prefix index, and the last one's hash.
    pub(super) registered_blocks: usize,
    pub(super) last_hash: Option<BlockHash>,
    /// The parent of the prompt's first block: its cache salt's root.
    pub(super) cache_root: Option<BlockHash>,
    /// Prefill worker: lease the prompt's KV at the end; the session whose
    /// snapshot may cover the prompt (bypass).
    pub(super) export: bool,
    pub(super) snapshot_session: Option<String>,
    /// When it was handed to the loop (the oldest waiting one's age is a
    /// watchdog gauge).
    pub(super) submitted: Instant,
    /// Time waited in the engine before the first token, by cause.
    pub(super) admission_wait: Duration,
    pub(super) prefill_wait: Duration,
    /// Structured outputs: the grammar's state (None: unconstrained).
    pub(super) constraint: Option<ConstraintState>,
    /// `prompt_logprobs`: the prompt tokens scored so far
    /// (prompt_logprobs.rs).
    pub(super) scoring: Option<prompt_logprobs::PromptScoring>,
}

impl Active {
    /// Feeds new text to the stop matcher, `generated` tokens being out: a
    /// stop string can complete only after `min_tokens` of them (vLLM).
    pub(super) fn stop_text(&mut self, text: &str, generated: usize) -> StopOutcome {
        if generated > self.sampler.params().min_tokens {
            self.stop.push(text)
        } else {
            self.stop.push_early(text)
        }
    }
}
