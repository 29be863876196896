//! `POST /v1/chat/completions`: messages -> chat template -> tokens ->
//! engine -> `chat.completion` (or a stream of `chat.completion.chunk`).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvc_engine::{FinishReason, MatchedStop, Usage};
use serde_json::{json, Map, Value};

use crate::app::AppState;
use crate::extract::OpenAiJson;
use crate::error::ApiError;
use crate::generate::{collect, new_request_id, serving_headers, submit, unix_now};
use crate::openai_types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChatDelta, ChatMessage, KvcInfo, MessageContent, Role, UsageInfo,
};
use crate::sampling::{DefaultMaxTokens, SamplingPlan};
use crate::sse::{stream_response, ChunkFormat};

pub async fn chat_completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let info = state.engine.info().clone();
    let plan = check_request(&req, info.vocab_size)?;
    let messages = template_messages(&req.messages)?;
    let engine = state.engine.clone();
    let prompt_tokens = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let template = engine.chat_template().ok_or_else(|| {
            ApiError::bad_request(
                "this model has no chat template; use /v1/completions with a raw prompt instead",
                Some("messages"),
            )
        })?;
        let tools = req.tools.map(Value::Array);
        let kwargs = req.chat_template_kwargs.unwrap_or_default();
        let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
        let prompt =
            template.render(&messages, tools.as_ref(), add_generation_prompt, &kwargs).map_err(ApiError::chat_engine)?;
        engine.tokenizer().encode(&prompt, req.add_special_tokens.unwrap_or(false)).map_err(ApiError::chat_engine)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("prompt preparation failed: {e}")))??;

    let sampling = plan.params_for(prompt_tokens.len(), info.max_model_len, DefaultMaxTokens::RestOfContext);
    let request_id = new_request_id("chatcmpl");
    let stream = submit(&state, &request_id, prompt_tokens, sampling, ApiError::chat_engine)?;
    let format = ChatFormat { id: request_id.clone(), created: unix_now(), model: info.id, include_usage: plan.include_usage };
    if plan.stream {
        return Ok(stream_response(&state, &request_id, stream, format, plan.include_usage));
    }
    let out = collect(&request_id, stream).await?;
    let body = ChatCompletion {
        id: format.id,
        object: "chat.completion",
        created: format.created,
        model: format.model,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage { role: "assistant", content: out.text },
            logprobs: None,
            finish_reason: out.finish_reason.as_str(),
            stop_reason: out.matched_stop,
        }],
        usage: out.usage.into(),
        kvc: KvcInfo::local(&out.usage),
    };
    Ok((serving_headers(&request_id), Json(body)).into_response())
}

/// Rejects what chat does not support (yet) and validates sampling.
fn check_request(req: &ChatCompletionRequest, vocab_size: usize) -> Result<SamplingPlan, ApiError> {
    if req.logprobs == Some(true) || req.top_logprobs.is_some_and(|n| n > 0) {
        let param = if req.logprobs == Some(true) { "logprobs" } else { "top_logprobs" };
        return Err(ApiError::unsupported("logprobs", param));
    }
    if let Some(format) = &req.response_format {
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some(other) => return Err(ApiError::unsupported(format!("response_format type {other:?}"), "response_format")),
            None => {
                return Err(ApiError::bad_request("response_format must be an object with a \"type\"", Some("response_format")))
            }
        }
    }
    match &req.tool_choice {
        None => {}
        Some(Value::String(s)) if s == "none" || s == "auto" => {}
        Some(other) => return Err(ApiError::unsupported(format!("tool_choice {other}"), "tool_choice")),
    }
    // max_completion_tokens supersedes max_tokens (OpenAI, vLLM).
    let max_tokens = match (req.max_completion_tokens, req.sampling.max_tokens) {
        (Some(m), _) => Some((m, "max_completion_tokens")),
        (None, Some(m)) => Some((m, "max_tokens")),
        (None, None) => None,
    };
    if let (Some(_), Some(m)) = (req.max_completion_tokens, req.sampling.max_tokens) {
        if m < 1 {
            return Err(ApiError::bad_request(format!("max_tokens must be at least 1, got {m}"), Some("max_tokens")));
        }
    }
    SamplingPlan::new(&req.sampling, max_tokens, vocab_size)
}

/// The messages as the chat template expects them: OpenAI-shaped objects
/// whose `content` is always a string (text parts joined by newlines, as
/// vLLM does for text-only models), `developer` rendered as `system`.
pub fn template_messages(messages: &[ChatMessage]) -> Result<Value, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must contain at least one message", Some("messages")));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let content = match &m.content {
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for part in parts {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => texts.push(t.as_str()),
                        ("text", None) => {
                            return Err(ApiError::bad_request(
                                format!("messages[{i}].content: a text part needs \"text\""),
                                Some("messages"),
                            ))
                        }
                        (other, _) => {
                            return Err(ApiError::unsupported(
                                format!("content parts of type {other:?} (messages[{i}]); only text parts are"),
                                "messages",
                            ))
                        }
                    }
                }
                texts.join("\n")
            }
            None if m.role == Role::Assistant && m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => String::new(),
            None => {
                return Err(ApiError::bad_request(format!("messages[{i}] has no content"), Some("messages")));
            }
        };
        let role = match m.role {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let mut obj = Map::new();
        obj.insert("role".into(), json!(role));
        obj.insert("content".into(), json!(content));
        if let Some(name) = &m.name {
            obj.insert("name".into(), json!(name));
        }
        if let Some(calls) = &m.tool_calls {
            obj.insert("tool_calls".into(), serde_json::to_value(calls).unwrap_or_default());
        }
        if let Some(id) = &m.tool_call_id {
            obj.insert("tool_call_id".into(), json!(id));
        }
        if let Some(r) = &m.reasoning_content {
            obj.insert("reasoning_content".into(), json!(r));
        }
        out.push(Value::Object(obj));
    }
    Ok(Value::Array(out))
}

/// `chat.completion.chunk`s of one stream.
struct ChatFormat {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl ChatFormat {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageInfo>, kvc: Option<KvcInfo>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
            kvc,
        }
    }

    fn choice(delta: ChatDelta, finish: Option<FinishReason>, stop: Option<MatchedStop>) -> ChatChunkChoice {
        ChatChunkChoice { index: 0, delta, logprobs: None, finish_reason: finish.map(FinishReason::as_str), stop_reason: stop }
    }
}

impl ChunkFormat for ChatFormat {
    type Chunk = ChatCompletionChunk;

    fn opening(&self) -> Option<Self::Chunk> {
        let delta = ChatDelta { role: Some("assistant"), content: Some(String::new()) };
        Some(self.chunk(vec![Self::choice(delta, None, None)], None, None))
    }

    fn text(&self, text: String) -> Self::Chunk {
        let delta = ChatDelta { role: None, content: Some(text) };
        self.chunk(vec![Self::choice(delta, None, None)], None, None)
    }

    fn finish(&self, reason: FinishReason, stop: Option<MatchedStop>, usage: &Usage) -> Self::Chunk {
        self.chunk(vec![Self::choice(ChatDelta::default(), Some(reason), stop)], None, Some(KvcInfo::local(usage)))
    }

    fn usage(&self, usage: &Usage) -> Self::Chunk {
        self.chunk(vec![], Some((*usage).into()), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;

    fn request(v: Value) -> ChatCompletionRequest {
        crate::extract::JsonBody::parse(v.to_string().as_bytes()).unwrap()
    }

    fn status_and_param(err: ApiError) -> (u16, Option<String>) {
        let (status, body) = error_response(&err);
        (status.as_u16(), body.error.param)
    }

    #[test]
    fn text_parts_are_joined_and_developer_becomes_system() {
        let req = request(json!({"messages": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}
        ]}));
        let m = template_messages(&req.messages).unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "rules"}));
        assert_eq!(m[1]["content"], "a\nb");
        assert_eq!(m[2]["content"], "");
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(m[3], json!({"role": "tool", "content": "ok", "tool_call_id": "c1"}));
    }

    #[test]
    fn empty_messages_and_missing_content_are_400() {
        let req = request(json!({"messages": []}));
        assert_eq!(status_and_param(template_messages(&req.messages).unwrap_err()), (400, Some("messages".into())));
        let req = request(json!({"messages": [{"role": "user"}]}));
        assert_eq!(template_messages(&req.messages).map_err(status_and_param).unwrap_err().0, 400);
        let req = request(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}));
        assert_eq!(template_messages(&req.messages).map_err(status_and_param).unwrap_err().0, 400);
    }

    #[test]
    fn unsupported_options_are_400_naming_the_param() {
        let base = |extra: Value| {
            let mut v = json!({"messages": [{"role": "user", "content": "hi"}]});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            check_request(&request(v), 1000).map_err(status_and_param)
        };
        assert_eq!(base(json!({"logprobs": true})).unwrap_err(), (400, Some("logprobs".into())));
        assert_eq!(base(json!({"top_logprobs": 2})).unwrap_err(), (400, Some("top_logprobs".into())));
        assert_eq!(base(json!({"response_format": {"type": "json_object"}})).unwrap_err(), (400, Some("response_format".into())));
        assert_eq!(base(json!({"tool_choice": "required"})).unwrap_err(), (400, Some("tool_choice".into())));
        assert_eq!(base(json!({"max_completion_tokens": 0})).unwrap_err(), (400, Some("max_completion_tokens".into())));
        assert_eq!(base(json!({"n": 3})).unwrap_err(), (400, Some("n".into())));
        assert!(base(json!({"logprobs": false, "response_format": {"type": "text"}, "tool_choice": "auto", "user": "u"})).is_ok());
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let req = request(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "max_completion_tokens": 7}));
        let plan = check_request(&req, 1000).unwrap();
        assert_eq!(plan.params_for(5, 100, DefaultMaxTokens::RestOfContext).max_tokens, 7);
    }

    #[test]
    fn stream_chunks_follow_openai_shape() {
        let f = ChatFormat { id: "chatcmpl-x".into(), created: 1, model: "m".into(), include_usage: true };
        let first = serde_json::to_value(f.opening().unwrap()).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert!(first["choices"][0]["finish_reason"].is_null());
        assert!(first["usage"].is_null() && first.get("usage").is_some());
        let usage = Usage { prompt_tokens: 4, completion_tokens: 2, cached_tokens: 0 };
        let fin = serde_json::to_value(f.finish(FinishReason::Length, None, &usage)).unwrap();
        assert_eq!(fin["choices"][0]["delta"], json!({}));
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert_eq!(fin["kvc"]["path"], "local");
        let last = serde_json::to_value(f.usage(&usage)).unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["total_tokens"], 6);

        let f = ChatFormat { include_usage: false, ..f };
        assert!(serde_json::to_value(f.text("x".into())).unwrap().get("usage").is_none());
    }
}
