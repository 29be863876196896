//! `POST /v1/completions`: a raw prompt (text or token ids) -> engine ->
//! `text_completion` (or a stream of them).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvc_engine::{FinishReason, MatchedStop, Usage};
use serde_json::Value;

use crate::app::AppState;
use crate::extract::OpenAiJson;
use crate::error::ApiError;
use crate::generate::{collect, new_request_id, serving_headers, submit, unix_now};
use crate::openai_types::{Completion, CompletionChoice, CompletionRequest, KvcInfo, UsageInfo};
use crate::sampling::{DefaultMaxTokens, SamplingPlan};
use crate::sse::{stream_response, ChunkFormat};

/// OpenAI's and vLLM's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// One prompt, as text to tokenize or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

pub async fn completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let info = state.engine.info().clone();
    let plan = check_request(&req, info.vocab_size)?;
    let prompt_tokens = match parse_prompt(&req.prompt, info.vocab_size)? {
        PromptInput::Tokens(t) => t,
        PromptInput::Text(text) => {
            let engine = state.engine.clone();
            let add_special = req.add_special_tokens.unwrap_or(true);
            tokio::task::spawn_blocking(move || engine.tokenizer().encode(&text, add_special))
                .await
                .map_err(|e| ApiError::Internal(format!("tokenization failed: {e}")))?
                .map_err(ApiError::completion_engine)?
        }
    };
    let sampling =
        plan.params_for(prompt_tokens.len(), info.max_model_len, DefaultMaxTokens::Fixed(DEFAULT_MAX_TOKENS));
    let request_id = new_request_id("cmpl");
    let stream = submit(&state, &request_id, prompt_tokens, sampling, ApiError::completion_engine)?;
    let format =
        CompletionFormat { id: request_id.clone(), created: unix_now(), model: info.id, include_usage: plan.include_usage };
    if plan.stream {
        return Ok(stream_response(&state, &request_id, stream, format, plan.include_usage));
    }
    let out = collect(&request_id, stream).await?;
    let body = Completion {
        id: format.id,
        object: "text_completion",
        created: format.created,
        model: format.model,
        choices: vec![CompletionChoice {
            index: 0,
            text: out.text,
            logprobs: None,
            finish_reason: Some(out.finish_reason.as_str()),
            stop_reason: out.matched_stop,
        }],
        usage: Some(Some(out.usage.into())),
        kvc: Some(KvcInfo::local(&out.usage)),
    };
    Ok((serving_headers(&request_id), Json(body)).into_response())
}

fn check_request(req: &CompletionRequest, vocab_size: usize) -> Result<SamplingPlan, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo"));
    }
    if req.logprobs.is_some() {
        return Err(ApiError::unsupported("logprobs", "logprobs"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix"));
    }
    if let Some(b) = req.best_of {
        if b != 1 {
            return Err(ApiError::unsupported(format!("best_of = {b} (only 1 is)"), "best_of"));
        }
    }
    SamplingPlan::new(&req.sampling, req.sampling.max_tokens.map(|m| (m, "max_tokens")), vocab_size)
}

/// Reads `prompt`: a string, a list of token ids, or a one-element list of
/// either. Several prompts in one request are not supported yet.
pub fn parse_prompt(v: &Value, vocab_size: usize) -> Result<PromptInput, ApiError> {
    let shape_error = || {
        ApiError::bad_request(
            "prompt must be a string, a list of token ids, or a list holding one of either",
            Some("prompt"),
        )
    };
    match v {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(items) if items.is_empty() => Err(ApiError::bad_request("prompt must not be empty", Some("prompt"))),
        Value::Array(items) if items.iter().all(Value::is_number) => token_ids(items, vocab_size).map(PromptInput::Tokens),
        Value::Array(items) if items.iter().all(|i| i.is_string() || i.is_array()) => match items.as_slice() {
            [Value::String(s)] => Ok(PromptInput::Text(s.clone())),
            [Value::Array(ids)] if !ids.is_empty() && ids.iter().all(Value::is_number) => {
                token_ids(ids, vocab_size).map(PromptInput::Tokens)
            }
            [Value::Array(ids)] if ids.is_empty() => Err(ApiError::bad_request("prompt must not be empty", Some("prompt"))),
            [_] => Err(shape_error()),
            _ => Err(ApiError::unsupported(format!("{} prompts in one request (batched prompts)", items.len()), "prompt")),
        },
        _ => Err(shape_error()),
    }
}

fn token_ids(items: &[Value], vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|item| match item.as_u64() {
            Some(id) if (id as usize) < vocab_size && id <= u32::MAX as u64 => Ok(id as u32),
            Some(id) => Err(ApiError::bad_request(
                format!("token id {id} is out of range: the model's vocabulary has {vocab_size} tokens"),
                Some("prompt"),
            )),
            None => Err(ApiError::bad_request(
                format!("prompt token ids must be non-negative integers, got {item}"),
                Some("prompt"),
            )),
        })
        .collect()
}

/// `text_completion` chunks of one stream.
struct CompletionFormat {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl CompletionFormat {
    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<UsageInfo>, kvc: Option<KvcInfo>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
            kvc,
        }
    }
}

impl ChunkFormat for CompletionFormat {
    type Chunk = Completion;

    fn opening(&self) -> Option<Completion> {
        None
    }

    fn text(&self, text: String) -> Completion {
        let choice = CompletionChoice { index: 0, text, logprobs: None, finish_reason: None, stop_reason: None };
        self.chunk(vec![choice], None, None)
    }

    fn finish(&self, reason: FinishReason, stop: Option<MatchedStop>, usage: &Usage) -> Completion {
        let choice = CompletionChoice {
            index: 0,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(reason.as_str()),
            stop_reason: stop,
        };
        self.chunk(vec![choice], None, Some(KvcInfo::local(usage)))
    }

    fn usage(&self, usage: &Usage) -> Completion {
        self.chunk(vec![], Some((*usage).into()), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;
    use serde_json::json;

    fn status_and_param(err: ApiError) -> (u16, Option<String>) {
        let (status, body) = error_response(&err);
        (status.as_u16(), body.error.param)
    }

    #[test]
    fn prompt_accepts_text_ids_and_one_element_lists() {
        assert_eq!(parse_prompt(&json!("hi"), 10).unwrap(), PromptInput::Text("hi".into()));
        assert_eq!(parse_prompt(&json!([1, 2]), 10).unwrap(), PromptInput::Tokens(vec![1, 2]));
        assert_eq!(parse_prompt(&json!(["hi"]), 10).unwrap(), PromptInput::Text("hi".into()));
        assert_eq!(parse_prompt(&json!([[3, 4]]), 10).unwrap(), PromptInput::Tokens(vec![3, 4]));
    }

    #[test]
    fn bad_prompts_are_400_naming_prompt() {
        for bad in [
            json!([]),
            json!([[]]),
            json!(["a", "b"]),
            json!([[1], [2]]),
            json!([1, "a"]),
            json!([-1]),
            json!([1.5]),
            json!([10]),
            json!([5_000_000_000u64]),
            json!(42),
            json!(null),
            json!({"text": "x"}),
        ] {
            assert_eq!(status_and_param(parse_prompt(&bad, 10).unwrap_err()), (400, Some("prompt".into())), "{bad}");
        }
    }

    #[test]
    fn missing_prompt_is_a_parse_error() {
        assert!(<CompletionRequest as crate::extract::JsonBody>::parse(br#"{"model": "m"}"#).is_err());
    }

    #[test]
    fn unsupported_options_are_400() {
        let check = |extra: Value| {
            let mut v = json!({"prompt": "x"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let req: CompletionRequest = crate::extract::JsonBody::parse(v.to_string().as_bytes()).unwrap();
            check_request(&req, 10).map_err(status_and_param)
        };
        assert_eq!(check(json!({"echo": true})).unwrap_err(), (400, Some("echo".into())));
        assert_eq!(check(json!({"logprobs": 0})).unwrap_err(), (400, Some("logprobs".into())));
        assert_eq!(check(json!({"suffix": "end"})).unwrap_err(), (400, Some("suffix".into())));
        assert_eq!(check(json!({"best_of": 2})).unwrap_err(), (400, Some("best_of".into())));
        assert_eq!(check(json!({"max_tokens": 0})).unwrap_err(), (400, Some("max_tokens".into())));
        assert!(check(json!({"echo": false, "suffix": "", "best_of": 1})).is_ok());
    }

    #[test]
    fn stream_chunks_carry_text_then_finish_reason() {
        let f = CompletionFormat { id: "cmpl-x".into(), created: 1, model: "m".into(), include_usage: false };
        assert!(f.opening().is_none());
        let t = serde_json::to_value(f.text("ab".into())).unwrap();
        assert_eq!(t["object"], "text_completion");
        assert_eq!(t["choices"][0]["text"], "ab");
        assert!(t["choices"][0]["finish_reason"].is_null());
        assert!(t.get("usage").is_none());
        let usage = Usage { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 0 };
        let fin = serde_json::to_value(f.finish(FinishReason::Stop, Some(MatchedStop::Text("x".into())), &usage)).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "stop");
        assert_eq!(fin["choices"][0]["stop_reason"], "x");
    }
}
