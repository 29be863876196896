//! Serde shapes of the OpenAI API: request bodies (unknown top-level fields
//! are refused like OpenAI does, see [`crate::request_fields`]) and
//! response objects.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::extract::{parse_json, JsonBody};
use crate::logprobs::{ChatLogprobs, CompletionLogprobs};
use crate::request_fields::{check_fields, Endpoint};

// ---------------------------------------------------------------- requests

/// Sampling and stopping fields shared by chat and completions. Integers
/// that must be positive are read as `i64` so that `0` and negatives reach
/// validation (and get a 400 naming the field) instead of a type error.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM extension; -1 or 0 disables.
    pub top_k: Option<i64>,
    /// vLLM extension.
    pub min_p: Option<f32>,
    /// vLLM extension: stop tokens and stop strings cannot end the output
    /// before this many tokens.
    pub min_tokens: Option<i64>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// vLLM extension.
    pub repetition_penalty: Option<f32>,
    pub stop: Option<StopSpec>,
    /// vLLM extension.
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM extension.
    pub ignore_eos: Option<bool>,
    pub n: Option<i64>,
    pub logit_bias: Option<Map<String, Value>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// vLLM extension (default true).
    pub skip_special_tokens: Option<bool>,
    /// Accepted and ignored.
    pub user: Option<String>,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

/// Unknown keys are refused like unknown top-level fields (the error
/// names the key).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// vLLM extension: with `include_usage`, every chunk carries the usage
    /// so far.
    pub continuous_usage_stats: Option<bool>,
}

/// Body of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// Optional like in vLLM; when present it must be the served name.
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Read from the same body in a second pass ([`JsonBody`]).
    #[serde(skip)]
    pub sampling: SamplingFields,
    /// vLLM's structured-output fields (`guided_*`, `structured_outputs`),
    /// read like `sampling`.
    #[serde(skip)]
    pub guided: crate::structured::GuidedFields,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub response_format: Option<Value>,
    /// Passed to the chat template.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// OpenAI (default true): false allows at most one tool call per
    /// answer (the grammar of `"required"`; the first call otherwise).
    pub parallel_tool_calls: Option<bool>,
    /// Extra template variables, e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM extension (default true).
    pub add_generation_prompt: Option<bool>,
    /// vLLM extension (default false for chat).
    pub add_special_tokens: Option<bool>,
    /// vLLM extension: the final assistant message is continued (prefill)
    /// instead of starting a new one.
    pub continue_final_message: Option<bool>,
    /// vLLM extension: with `continue_final_message`, the returned message
    /// includes the continued part.
    pub echo: Option<bool>,
    /// kvc extension: the session this turn belongs to (else header
    /// `x-session-id`).
    pub session_id: Option<String>,
    /// vLLM extension: cached KV is shared only with requests of the same
    /// salt (and sessions are kept per salt).
    pub cache_salt: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for `system`; rendered as `system`.
    Developer,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(default)]
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    /// An earlier turn's reasoning (Qwen3's template reads it).
    pub reasoning_content: Option<String>,
}

/// `content`: a string or a list of content parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON string per OpenAI; an object is accepted too.
    pub arguments: Value,
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// A string, a list of strings, a list of token ids, or a list of lists
    /// of token ids ([`crate::completion_prompts`]).
    pub prompt: Value,
    /// Read from the same body in a second pass ([`JsonBody`]).
    #[serde(skip)]
    pub sampling: SamplingFields,
    /// vLLM's structured-output fields (`guided_*`, `structured_outputs`),
    /// read like `sampling`.
    #[serde(skip)]
    pub guided: crate::structured::GuidedFields,
    pub echo: Option<bool>,
    pub logprobs: Option<i64>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
    /// vLLM extension (default true for completions).
    pub add_special_tokens: Option<bool>,
    /// kvc extension: the session this request belongs to.
    pub session_id: Option<String>,
    /// vLLM extension: as chat's.
    pub cache_salt: Option<String>,
}

/// How many `tools` a body has, counted without building them, so that a
/// request with too many is refused before its full parses (four passes
/// over the body, each building every tool).
#[derive(Deserialize)]
struct ToolCount {
    #[serde(default)]
    tools: Option<Count>,
}

/// A JSON array's length (its elements skipped).
struct Count(usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }
        d.deserialize_seq(V)
    }
}

impl JsonBody for ChatCompletionRequest {
    fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        if let Ok(ToolCount { tools: Some(Count(n)) }) = serde_json::from_slice::<ToolCount>(bytes) {
            crate::tool_limit::check_tool_count(n)?;
        }
        let mut req: Self = parse_json(bytes)?;
        req.sampling = parse_json(bytes)?;
        req.guided = parse_json(bytes)?;
        check_fields(bytes, Endpoint::Chat)?;
        Ok(req)
    }
}

impl JsonBody for CompletionRequest {
    fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let mut req: Self = parse_json(bytes)?;
        req.sampling = parse_json(bytes)?;
        req.guided = parse_json(bytes)?;
        check_fields(bytes, Endpoint::Completions)?;
        Ok(req)
    }
}

// --------------------------------------------------------------- responses

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Absent from a stream's running usage (`continuous_usage_stats`):
    /// the cached count is known at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl From<kvc_engine::Usage> for UsageInfo {
    fn from(u: kvc_engine::Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: u.cached_tokens }),
        }
    }
}

/// How a request was served (README, "Sessions"), the `kvc` extension field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvcInfo {
    pub path: &'static str,
    pub reason: &'static str,
    /// What the KV reuse came from: cold, session_hit, prefix_hit (on this
    /// worker; a remote prefill's bypass shows in `path`).
    pub reuse: &'static str,
    pub cached_tokens: usize,
    pub computed_tokens: usize,
    pub transferred_tokens: usize,
}

impl KvcInfo {
    pub fn local(u: &kvc_engine::Usage) -> Self {
        Self {
            path: u.path.as_str(),
            reason: if u.path_reason.is_empty() { u.reuse_reason.as_str() } else { u.path_reason },
            reuse: u.reuse_reason.as_str(),
            cached_tokens: u.cached_tokens,
            computed_tokens: u.prompt_tokens.saturating_sub(u.cached_tokens),
            transferred_tokens: u.transferred_tokens,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is only tool calls or only reasoning.
    pub content: Option<String>,
    /// vLLM / SGLang extension: the `<think>` part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call in a streamed delta: the whole call at once (kvc emits a
/// call when its block is complete).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCallDelta {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
    /// vLLM extension: the stop string or token id that ended generation.
    pub stop_reason: Option<kvc_engine::MatchedStop>,
}

/// What an answer object starts with: the same in every chunk of an answer
/// and in its whole body, but for `object` (chat's chunks and body differ).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnswerHead {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
}

impl AnswerHead {
    /// The same head on an object of kind `object`.
    pub fn of(&self, object: &'static str) -> AnswerHead {
        AnswerHead { object, ..self.clone() }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    #[serde(flatten)]
    pub head: AnswerHead,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageInfo,
    pub kvc: KvcInfo,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

impl ChatDelta {
    pub fn is_empty(&self) -> bool {
        self.role.is_none() && self.content.is_none() && self.reasoning_content.is_none() && self.tool_calls.is_none()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<kvc_engine::MatchedStop>,
}

/// `usage` on a streaming chunk: absent unless `include_usage`, then `null`
/// on every chunk but the last (the usage so far with
/// `continuous_usage_stats`).
pub type ChunkUsage = Option<Option<UsageInfo>>;

/// A streaming chunk of either endpoint, choices `C` (chat's
/// `chat.completion.chunk`, completions' [`Completion`]): the answer's
/// head, its choices' deltas, the usage (when asked for) and the `kvc`
/// field.
#[derive(Debug, Clone, Serialize)]
pub struct Chunk<C> {
    #[serde(flatten)]
    pub head: AnswerHead,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: ChunkUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvc: Option<KvcInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<kvc_engine::MatchedStop>,
}

/// Both the full `text_completion` object and its streaming chunks (OpenAI
/// uses the same object name for both).
pub type Completion = Chunk<CompletionChoice>;

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse<T: JsonBody>(v: Value) -> Result<T, ApiError> {
        T::parse(v.to_string().as_bytes())
    }

    #[test]
    fn chat_request_accepts_openai_message_shapes_and_refuses_unknown_fields() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}
            ],
            "max_tokens": 5, "temperature": 0, "stop": "x", "stream": true,
            "stream_options": {"include_usage": true},
            "chat_template_kwargs": {"enable_thinking": false},
            "session_id": "s1", "user": "u"
        });
        let req: ChatCompletionRequest = parse(body).unwrap();
        assert_eq!(req.messages.len(), 4);
        assert_eq!(req.messages[3].role, Role::Tool);
        assert!(matches!(req.messages[1].content, Some(MessageContent::Parts(ref p)) if p.len() == 2));
        assert_eq!(req.sampling.max_tokens, Some(5));
        assert_eq!(req.sampling.temperature, Some(0.0));
        assert_eq!(req.sampling.stop, Some(StopSpec::One("x".into())));
        assert_eq!(req.sampling.stream_options.unwrap().include_usage, Some(true));
        assert_eq!(req.chat_template_kwargs.unwrap()["enable_thinking"], json!(false));
        assert_eq!(req.session_id.as_deref(), Some("s1"));
        let unknown = json!({"messages": [], "some_future_field": {"anything": 1}});
        assert!(parse::<ChatCompletionRequest>(unknown).is_err());
    }

    #[test]
    fn chat_request_without_messages_or_with_wrong_types_is_rejected() {
        assert!(parse::<ChatCompletionRequest>(json!({"model": "m"})).is_err());
        let wrong = json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"});
        assert!(parse::<ChatCompletionRequest>(wrong).is_err());
        let bad_role = json!({"messages": [{"role": "wizard", "content": "x"}]});
        assert!(parse::<ChatCompletionRequest>(bad_role).is_err());
    }

    #[test]
    fn negative_and_zero_max_tokens_parse_so_validation_can_name_them() {
        let req: ChatCompletionRequest = parse(json!({"messages": [], "max_tokens": -3})).unwrap();
        assert_eq!(req.sampling.max_tokens, Some(-3));
    }

    #[test]
    fn completion_request_keeps_prompt_as_json() {
        let req: CompletionRequest = parse(json!({"prompt": [1, 2, 3], "stop": ["a", "b"]})).unwrap();
        assert_eq!(req.prompt, json!([1, 2, 3]));
        assert_eq!(req.sampling.stop.unwrap().into_vec(), vec!["a", "b"]);
    }

    #[test]
    fn chunk_usage_is_absent_null_or_filled() {
        let chunk = |usage: ChunkUsage| {
            serde_json::to_value(Completion {
                head: AnswerHead {
                    id: "c".into(),
                    object: "text_completion",
                    created: 0,
                    model: "m".into(),
                    system_fingerprint: "fp_t".into(),
                },
                choices: vec![],
                usage,
                kvc: None,
            })
            .unwrap()
        };
        assert!(chunk(None).get("usage").is_none());
        assert!(chunk(Some(None))["usage"].is_null());
        let u = kvc_engine::Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 1, ..Default::default() };
        let v = chunk(Some(Some(u.into())));
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }

    #[test]
    fn unknown_stream_options_are_refused_naming_them() {
        let ok: CompletionRequest =
            parse(json!({"prompt": "x", "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}))
                .unwrap();
        assert_eq!(ok.sampling.stream_options.unwrap().continuous_usage_stats, Some(true));
        let err = parse::<CompletionRequest>(json!({"prompt": "x", "stream": true, "stream_options": {"every_chunk": true}})).unwrap_err();
        let (status, body) = crate::error::error_response(&err);
        assert_eq!((status.as_u16(), body.error.param.as_deref()), (400, Some("stream_options")));
        assert!(body.error.message.contains("every_chunk"), "{}", body.error.message);
    }

    #[test]
    fn kvc_info_counts_computed_tokens() {
        let u = kvc_engine::Usage { prompt_tokens: 10, completion_tokens: 2, cached_tokens: 4, ..Default::default() };
        let k = KvcInfo::local(&u);
        assert_eq!((k.path, k.reason, k.cached_tokens, k.computed_tokens, k.transferred_tokens), ("local", "cold", 4, 6, 0));
    }
}
