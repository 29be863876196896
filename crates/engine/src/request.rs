//! What callers hand the engine and what they get back.
//!
//! The server builds a [`GenerateRequest`] from an OpenAI request (after
//! rendering the chat template and tokenizing) and reads [`StreamEvent`]s
//! from the returned [`RequestStream`]. Dropping the stream cancels the
//! request: the engine notices the closed channel and frees its blocks.

use serde::Serialize;

pub use kvc_wire::{Logprobs, SamplingParams, ServePath, TokenLogprob};

/// One generation request, prompt already tokenized.
#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    /// Caller's id, used in logs (`chatcmpl-...`).
    pub request_id: String,
    pub prompt_tokens: Vec<u32>,
    pub sampling: SamplingParams,
    /// The session this turn belongs to (matched exactly); its KV is kept
    /// after the turn and reused by the next one.
    pub session_id: Option<String>,
    /// vLLM's `cache_salt`: the prompt's blocks are hashed under it, so it
    /// shares cached KV only with requests of the same salt.
    pub cache_salt: Option<String>,
    /// `sampling.constraint` compiled ([`crate::EngineHandle::compile_grammar`]);
    /// when missing, submission compiles it.
    pub grammar: Option<crate::CompiledGrammar>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` reached, or the model's context is full.
    Length,
    /// Cancelled by the caller (never reaches a connected client).
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Token counts for OpenAI's `usage`, and how the prompt was served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV was reused instead of computed.
    pub cached_tokens: usize,
    /// Where the reused KV came from.
    pub reuse_reason: crate::ReusePath,
    /// Blocks of this request's reused KV brought back from host memory.
    pub restored_blocks: usize,
    /// Set by a disaggregated server: how the prompt was served and why,
    /// and the prompt tokens whose KV arrived by transfer.
    pub path: ServePath,
    pub path_reason: &'static str,
    pub transferred_tokens: usize,
    /// How long the request waited in the engine before its first token for
    /// memory or a sequence slot ("waiting for admission"), and for a
    /// prefill slot or step budget ("waiting behind other prefills").
    #[serde(skip)]
    pub admission_wait: std::time::Duration,
    #[serde(skip)]
    pub prefill_wait: std::time::Duration,
}

impl Usage {
    /// Prompt tokens that went through the model.
    pub fn computed_tokens(&self) -> usize {
        self.prompt_tokens - self.cached_tokens
    }
}

/// What the engine sends back, in order: the prompt's logprobs when asked
/// for, any number of `Token`s, then exactly one `Finished` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Token {
        token_id: u32,
        /// Text that became final with this token (may be empty while a
        /// UTF-8 sequence or a possible stop-string match is held back).
        text: String,
        logprobs: Option<Logprobs>,
    },
    Finished {
        reason: FinishReason,
        /// Held-back text released at the end (never contains a stop string).
        text: String,
        /// The stop string or stop token id that ended generation, if any.
        matched_stop: Option<MatchedStop>,
        usage: Usage,
        /// Requests submitted with [`crate::EngineHandle::submit_export`]:
        /// the prompt's blocks, held until the lease is dropped.
        export: Option<crate::KvLease>,
    },
    /// `prompt_logprobs`: the logprobs of the next prompt tokens, in
    /// prompt order from the second token (the first has none), in one or
    /// more events (one per prefill chunk) before any `Token`.
    PromptLogprobs(Vec<Logprobs>),
    Error(String),
    /// The request's structured-output grammar failed while generating
    /// (it allows no continuation, or its matcher hit one of its limits):
    /// the client's input, not the server's fault. The message is short
    /// (no matcher state).
    InvalidGrammar(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MatchedStop {
    TokenId(u32),
    Text(String),
}
