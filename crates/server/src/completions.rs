//! `POST /v1/completions`: a raw prompt (text or token ids) -> engine ->
//! `text_completion` (or a stream of them), with `logprobs`, `echo` and
//! `n`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kvc_engine::{FinishReason, Logprobs, MatchedStop, Usage};
use serde_json::Value;

use crate::app::{AppState, Arrival};
use crate::error::ApiError;
use crate::extract::OpenAiJson;
use crate::generate::{admit, check_prompt_bytes, check_prompt_len, serving_headers, submit, within, Submission};
use crate::logprobs::{CompletionLogprobs, HasTokenizer, MAX_TOP_LOGPROBS};
use crate::openai_types::{ChunkUsage, Completion, CompletionChoice, CompletionRequest, KvcInfo};
use crate::response::{collect, Endpoint};
use crate::sampling::{DefaultMaxTokens, SamplingPlan};
use crate::sse::stream_response;

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
    arrival: Option<Extension<Arrival>>,
    tenant: Option<Extension<crate::tenant::Tenant>>,
    headers: HeaderMap,
    OpenAiJson(req): OpenAiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let arrival = arrival.map_or_else(Instant::now, |Extension(Arrival(t))| t);
    state.check_model(req.model.as_deref())?;
    let info = state.engine.info().clone();
    let plan = check_request(&req, info.vocab_size)?;
    // Structured outputs: vLLM's guided_* / structured_outputs fields (a
    // raw prompt has no reasoning block to wait for).
    let grammar = crate::structured::from_guided(&req.guided)?;
    let prompt = parse_prompt(&req.prompt, info.vocab_size)?;
    if let PromptInput::Text(text) = &prompt {
        check_prompt_bytes(&state, text.len(), "prompt")?;
    }
    let tenant = tenant.map(|Extension(t)| t).unwrap_or_default();
    let (session_id, cache_salt) =
        crate::sessions::request_scope(&state, &tenant, req.session_id.as_deref(), req.cache_salt.as_deref(), &headers)?;
    let admitted = admit(&state, arrival, "cmpl").await?;
    let echo = req.echo == Some(true);
    let skip_special = req.sampling.skip_special_tokens.unwrap_or(true);
    let engine = state.engine.clone();
    let add_special = req.add_special_tokens.unwrap_or(true);
    type Prepared = (Vec<u32>, Option<String>, Option<(kvc_engine::Constraint, kvc_engine::CompiledGrammar)>);
    let prepare = tokio::task::spawn_blocking(move || -> Result<Prepared, ApiError> {
        let compiled = match grammar {
            Some(g) => {
                let constraint = g.constraint(kvc_engine::ReasoningGate::Off);
                let compiled = engine.compile_grammar(&constraint).map_err(|e| crate::structured::compile_error(e, g.param))?;
                Some((constraint, compiled))
            }
            None => None,
        };
        let (ids, echoed) = match prompt {
            PromptInput::Tokens(ids) => {
                let echoed =
                    if echo { Some(engine.tokenizer().decode(&ids, skip_special).map_err(ApiError::completion_engine)?) } else { None };
                (ids, echoed)
            }
            PromptInput::Text(text) => {
                let ids = engine.tokenizer().encode(&text, add_special).map_err(ApiError::completion_engine)?;
                (ids, echo.then_some(text))
            }
        };
        Ok((ids, echoed, compiled))
    });
    let (prompt_tokens, echoed, compiled) =
        within(&state, admitted.deadline(), prepare).await?.map_err(|e| ApiError::Internal(format!("tokenization failed: {e}")))??;
    check_prompt_len(&state, prompt_tokens.len(), "prompt")?;

    let mut sampling = plan.params_for(prompt_tokens.len(), info.max_model_len, DefaultMaxTokens::Fixed(DEFAULT_MAX_TOKENS));
    let (constraint, grammar) = compiled.unzip();
    sampling.constraint = constraint;
    let n = plan.n;
    let generation = submit(
        &state,
        admitted,
        Submission { prompt_tokens, sampling, n, session_id, cache_salt, grammar, map_err: ApiError::completion_engine },
    )
    .await?;
    let endpoint = CompletionEndpoint::new(
        generation.request_id().to_string(),
        info.id,
        n,
        echoed,
        req.logprobs.is_some(),
        Arc::new(state.engine.clone()),
    );
    if plan.stream {
        return Ok(stream_response(&state, generation, endpoint, plan.include_usage));
    }
    let request_id = generation.request_id().to_string();
    let path = generation.path();
    let body = collect(generation, endpoint).await?;
    Ok((serving_headers(&request_id, path), Json(body)).into_response())
}

fn check_request(req: &CompletionRequest, vocab_size: usize) -> Result<SamplingPlan, ApiError> {
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad_request(format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"), Some("logprobs")))
        }
    };
    if req.echo == Some(true) && logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo together with logprobs (it needs the prompt's logprobs, which the engine cannot compute yet)",
            "echo",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix"));
    }
    if let Some(b) = req.best_of {
        let n = req.sampling.n.unwrap_or(1);
        if b != n && b != 1 {
            return Err(ApiError::unsupported(format!("best_of = {b} (only best_of = 1 or = n is)"), "best_of"));
        }
    }
    let mut plan = SamplingPlan::new(&req.sampling, req.sampling.max_tokens.map(|m| (m, "max_tokens")), vocab_size)?;
    plan.set_logprobs(logprobs);
    Ok(plan)
}

/// Reads `prompt`: a string, a list of token ids, or a one-element list of
/// either. Several prompts in one request are not supported yet.
pub fn parse_prompt(v: &Value, vocab_size: usize) -> Result<PromptInput, ApiError> {
    let shape_error =
        || ApiError::bad_request("prompt must be a string, a list of token ids, or a list holding one of either", Some("prompt"));
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
            None => Err(ApiError::bad_request(format!("prompt token ids must be non-negative integers, got {item}"), Some("prompt"))),
        })
        .collect()
}

struct ChoiceState {
    /// Characters of text so far (the next token's `text_offset`).
    offset: usize,
    pending: CompletionLogprobs,
}

/// `text_completion` deltas for `n` choices.
pub struct CompletionEndpoint {
    id: String,
    created: u64,
    model: String,
    echo: Option<String>,
    logprobs: bool,
    tokens: Arc<dyn HasTokenizer>,
    choices: Vec<ChoiceState>,
}

impl CompletionEndpoint {
    pub fn new(id: String, model: String, n: usize, echo: Option<String>, logprobs: bool, tokens: Arc<dyn HasTokenizer>) -> Self {
        let offset = echo.as_deref().map_or(0, |e| e.chars().count());
        let choices = (0..n).map(|_| ChoiceState { offset, pending: CompletionLogprobs::default() }).collect();
        Self { id, created: crate::generate::unix_now(), model, echo, logprobs, tokens, choices }
    }

    fn take_logprobs(&mut self, index: usize) -> Option<CompletionLogprobs> {
        let pending = std::mem::take(&mut self.choices[index].pending);
        self.logprobs.then_some(pending)
    }

    fn choice(index: usize, text: String, logprobs: Option<CompletionLogprobs>) -> CompletionChoice {
        CompletionChoice { index, text, logprobs, finish_reason: None, stop_reason: None }
    }
}

impl Endpoint for CompletionEndpoint {
    type Delta = CompletionChoice;
    type Chunk = Completion;
    type Body = Completion;

    fn start(&mut self, index: usize) -> Vec<CompletionChoice> {
        match &self.echo {
            Some(prompt) if !prompt.is_empty() => vec![Self::choice(index, prompt.clone(), None)],
            _ => Vec::new(),
        }
    }

    fn token(&mut self, index: usize, _token_id: u32, text: &str, logprobs: Option<&Logprobs>) -> Option<CompletionChoice> {
        if let (true, Some(lp)) = (self.logprobs, logprobs) {
            let choice = &mut self.choices[index];
            choice.offset += choice.pending.push(self.tokens.tokenizer(), lp, choice.offset);
        }
        if text.is_empty() {
            return None;
        }
        Some(Self::choice(index, text.to_string(), self.take_logprobs(index)))
    }

    fn finish(
        &mut self,
        index: usize,
        text: &str,
        reason: FinishReason,
        stop: Option<MatchedStop>,
    ) -> (Vec<CompletionChoice>, &'static str) {
        let mut last = Self::choice(index, text.to_string(), self.take_logprobs(index));
        last.finish_reason = Some(reason.as_str());
        last.stop_reason = stop;
        (vec![last], reason.as_str())
    }

    fn chunk(&self, deltas: Vec<CompletionChoice>, usage: ChunkUsage, kvc: Option<KvcInfo>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: deltas,
            usage,
            kvc,
        }
    }

    fn body(&self, choices: Vec<Vec<CompletionChoice>>, usage: Usage) -> Completion {
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(index, deltas)| {
                let mut whole = Self::choice(index, String::new(), self.logprobs.then(CompletionLogprobs::default));
                for d in deltas {
                    whole.text.push_str(&d.text);
                    if let (Some(all), Some(lp)) = (whole.logprobs.as_mut(), d.logprobs) {
                        all.extend(lp);
                    }
                    if d.finish_reason.is_some() {
                        (whole.finish_reason, whole.stop_reason) = (d.finish_reason, d.stop_reason);
                    }
                }
                whole
            })
            .collect();
        self.chunk(choices, Some(Some(usage.into())), Some(KvcInfo::local(&usage)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;
    use kvc_engine::tokenizer::TextTokenizer;
    use kvc_engine::TokenLogprob;
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
    fn unsupported_or_invalid_options_are_400() {
        let check = |extra: Value| {
            let mut v = json!({"prompt": "x"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let req: CompletionRequest = crate::extract::JsonBody::parse(v.to_string().as_bytes()).unwrap();
            check_request(&req, 10).map_err(status_and_param)
        };
        assert_eq!(check(json!({"echo": true, "logprobs": 1})).unwrap_err(), (400, Some("echo".into())));
        assert_eq!(check(json!({"logprobs": 21})).unwrap_err(), (400, Some("logprobs".into())));
        assert_eq!(check(json!({"logprobs": -1})).unwrap_err(), (400, Some("logprobs".into())));
        assert_eq!(check(json!({"suffix": "end"})).unwrap_err(), (400, Some("suffix".into())));
        assert_eq!(check(json!({"best_of": 2})).unwrap_err(), (400, Some("best_of".into())));
        assert_eq!(check(json!({"max_tokens": 0})).unwrap_err(), (400, Some("max_tokens".into())));
        assert!(check(json!({"echo": true, "suffix": "", "best_of": 1, "logprobs": null})).is_ok());
        assert!(check(json!({"logprobs": 5, "n": 2, "best_of": 2})).is_ok());
    }

    fn endpoint(echo: Option<&str>, logprobs: bool) -> CompletionEndpoint {
        let tok = Arc::new(TextTokenizer::embedded_qwen3().unwrap());
        CompletionEndpoint::new("cmpl-x".into(), "m".into(), 1, echo.map(str::to_string), logprobs, tok)
    }

    #[test]
    fn echo_comes_first_and_offsets_count_from_it() {
        let mut e = endpoint(Some("Say: "), true);
        let tok = TextTokenizer::embedded_qwen3().unwrap();
        let ids = tok.encode("hello world", false).unwrap();
        let mut deltas = e.start(0);
        assert_eq!(deltas[0].text, "Say: ");
        for (i, &id) in ids.iter().enumerate() {
            let text = tok.decode(&ids[i..=i], false).unwrap();
            let lp =
                Logprobs { chosen: TokenLogprob { token_id: id, logprob: -1.0 }, top: vec![TokenLogprob { token_id: id, logprob: -1.0 }] };
            deltas.extend(e.token(0, id, &text, Some(&lp)));
        }
        deltas.extend(e.finish(0, "", FinishReason::Length, None).0);
        let usage = Usage { prompt_tokens: 3, completion_tokens: ids.len(), ..Default::default() };
        let body = serde_json::to_value(e.body(vec![deltas], usage)).unwrap();
        let choice = &body["choices"][0];
        assert_eq!(choice["text"], "Say: hello world");
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(choice["logprobs"]["tokens"], json!(["hello", " world"]));
        assert_eq!(choice["logprobs"]["text_offset"], json!([5, 10]));
        assert_eq!(choice["logprobs"]["top_logprobs"][1], json!({" world": -1.0}));
        assert_eq!(body["usage"]["completion_tokens"], ids.len());
    }

    #[test]
    fn stream_chunks_carry_text_then_finish_reason() {
        let mut e = endpoint(None, false);
        assert!(e.start(0).is_empty());
        let delta = e.token(0, 1, "ab", None).unwrap();
        let t = serde_json::to_value(e.chunk(vec![delta], None, None)).unwrap();
        assert_eq!(t["object"], "text_completion");
        assert_eq!(t["choices"][0]["text"], "ab");
        assert!(t["choices"][0]["finish_reason"].is_null() && t["choices"][0]["logprobs"].is_null());
        assert!(t.get("usage").is_none());
        assert!(e.token(0, 2, "", None).is_none(), "held-back text sends nothing");
        let (fin, reported) = e.finish(0, "", FinishReason::Stop, Some(MatchedStop::Text("x".into())));
        let fin = serde_json::to_value(e.chunk(fin, None, None)).unwrap();
        assert_eq!((fin["choices"][0]["finish_reason"].as_str(), reported), (Some("stop"), "stop"));
        assert_eq!(fin["choices"][0]["stop_reason"], "x");
    }
}
