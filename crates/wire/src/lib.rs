//! The types that cross a process boundary between kvc workers, and so
//! must not pull an engine with them: the sampling parameters a decode
//! worker hands a prefill worker, the logprobs it gets back, and how a
//! prompt was served. `kvc-engine` re-exports them; `kvc-disagg`'s wire
//! protocol uses them without depending on the engine.

use serde::{Deserialize, Serialize};

mod constraint;
pub use constraint::{Constraint, Grammar, ReasoningGate};

/// A sampling parameter out of its range; `param` names it (OpenAI's
/// error `param`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    pub param: String,
    pub message: String,
}

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
    /// Maximum number of generated tokens; 0 computes the prompt (and its
    /// `prompt_logprobs`) without generating.
    pub max_tokens: usize,
    /// Tokens generated before a stop token or stop string may end the
    /// output (vLLM's `min_tokens`; 0: none). Until then the stop tokens
    /// are masked, unless a grammar allows nothing else.
    #[serde(default)]
    pub min_tokens: usize,
    /// Extra token ids that end generation (the model's EOS ids are added
    /// by the engine unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Stop strings; the matched string is not part of the output.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Number of top alternatives to report per generated token
    /// (`Some(0)` = only the chosen token's logprob).
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: the logprob of every prompt token after
    /// the first (which has none), with this many top alternatives each,
    /// sent before any generated token.
    #[serde(default)]
    pub prompt_logprobs: Option<usize>,
    /// Additive biases on logits, by token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// Do not produce text for special tokens (default true, like vLLM).
    pub skip_special_tokens: bool,
    /// Structured outputs: the grammar the output must match.
    #[serde(default)]
    pub constraint: Option<Constraint>,
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
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the error names the offending parameter.
    pub fn validate(&self) -> Result<(), ParamError> {
        let bad = |param: &str, msg: String| Err(ParamError { param: param.to_string(), message: msg });
        if !(self.temperature >= 0.0 && self.temperature <= 2.0) {
            return bad("temperature", format!("temperature must be in [0, 2], got {}", self.temperature));
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
        if self.min_tokens > self.max_tokens {
            return bad("min_tokens", format!("min_tokens must be at most max_tokens ({}), got {}", self.max_tokens, self.min_tokens));
        }
        Ok(())
    }
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
