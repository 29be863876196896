//! What callers hand the engine and what they get back.
//!
//! The server builds a [`GenerateRequest`] from an OpenAI request (after
//! rendering the chat template and tokenizing) and reads [`StreamEvent`]s
//! from the returned [`RequestStream`]. Dropping the stream cancels the
//! request: the engine notices the closed channel and frees its blocks.

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// Sampling and stopping parameters, already validated by the caller
/// (see [`SamplingParams::validate`]). Serializable so a decode worker can
/// hand them to a prefill worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 1.0 disables nucleus sampling.
    pub top_p: f32,
    /// 0 (or negative in OpenAI-style APIs, mapped to 0) disables top-k.
    pub top_k: usize,
    /// 0.0 disables min-p.
    pub min_p: f32,
    /// Per-request RNG seed; `None` draws one at submission.
    pub seed: Option<u64>,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// 1.0 disables it.
    pub repetition_penalty: f32,
    /// Maximum number of generated tokens.
    pub max_tokens: usize,
    /// Extra token ids that end generation (the model's EOS ids are added
    /// by the engine unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Stop strings; the matched string is not part of the output.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Number of top alternatives to report per generated token
    /// (`Some(0)` = only the chosen token's logprob).
    pub logprobs: Option<usize>,
    /// Additive biases on logits, by token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// Do not produce text for special tokens (default true, like vLLM).
    pub skip_special_tokens: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            max_tokens: 16,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            logit_bias: Vec::new(),
            skip_special_tokens: true,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the error names the offending parameter.
    pub fn validate(&self) -> Result<(), crate::EngineError> {
        let bad = |param: &str, msg: String| Err(crate::EngineError::InvalidParam { param: param.to_string(), message: msg });
        if !(self.temperature >= 0.0) || !self.temperature.is_finite() {
            // An f64 beyond f32's range arrives here as inf: say the range.
            return bad("temperature", format!("temperature must be a number from 0 to {:e}, got {}", f32::MAX, self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad("min_p", format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.frequency_penalty >= -2.0 && self.frequency_penalty <= 2.0) {
            return bad("frequency_penalty", format!("frequency_penalty must be in [-2, 2], got {}", self.frequency_penalty));
        }
        if !(self.presence_penalty >= -2.0 && self.presence_penalty <= 2.0) {
            return bad("presence_penalty", format!("presence_penalty must be in [-2, 2], got {}", self.presence_penalty));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        if self.max_tokens == 0 {
            return bad("max_tokens", "max_tokens must be at least 1".to_string());
        }
        Ok(())
    }
}

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
}

/// How a request's prompt was served (`x-kvc-path`, the `kvc` body field):
/// here, on a worker without disaggregation or by choice ([`Self::Local`]),
/// here extending a resident session ([`Self::DirectAppend`]), or on a
/// prefill worker, from scratch ([`Self::RemotePrefill`]) or from its
/// snapshot of the session ([`Self::Bypass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServePath {
    #[default]
    Local,
    DirectAppend,
    RemotePrefill,
    Bypass,
}

impl ServePath {
    pub fn as_str(self) -> &'static str {
        match self {
            ServePath::Local => "local",
            ServePath::DirectAppend => "direct_append",
            ServePath::RemotePrefill => "remote_prefill",
            ServePath::Bypass => "bypass",
        }
    }
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

/// Log-probability of one candidate token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
}

/// Log-probabilities for one generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    pub chosen: TokenLogprob,
    /// Most likely alternatives, best first (length = requested top count).
    pub top: Vec<TokenLogprob>,
}

/// What the engine sends back, in order: any number of `Token`s, then
/// exactly one `Finished` or `Error`.
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
    Error(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MatchedStop {
    TokenId(u32),
    Text(String),
}

/// Receiving end of a request. Dropping it cancels the request.
pub struct RequestStream {
    pub(crate) rx: mpsc::UnboundedReceiver<StreamEvent>,
    pub(crate) cancel: crate::CancelGuard,
}

impl RequestStream {
    /// Next event, or `None` after the final event.
    pub async fn recv(&mut self) -> Option<StreamEvent> {
        self.rx.recv().await
    }

    /// Blocking variant for tests and non-async callers.
    pub fn blocking_recv(&mut self) -> Option<StreamEvent> {
        self.rx.blocking_recv()
    }

    /// The next event if one has arrived; never waits.
    pub fn try_recv(&mut self) -> Option<StreamEvent> {
        self.rx.try_recv().ok()
    }

    /// The engine's id of this request.
    pub fn id(&self) -> u64 {
        self.cancel.seq_id
    }
}
