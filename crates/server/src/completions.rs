//! `POST /v1/completions`: raw prompts (text or token ids, one or a batch)
//! -> engine -> `text_completion` (or a stream of them), with `logprobs`,
//! `echo`, `n` and `best_of`; scoring as vLLM serves it to lm-eval: `echo`
//! with `logprobs` returns the prompt's token logprobs (the engine's
//! `prompt_logprobs`), and `max_tokens: 0` with `echo` scores the prompt
//! without generating.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use crate::backend::Submission;
use crate::completion_endpoint::{CompletionEndpoint, CompletionShape, EchoedPrompt};
use crate::completion_prompts::{parse_prompts, PromptInput, MAX_PROMPTS};
use crate::error::ApiError;
use crate::extract::OpenAiJson;
use crate::generate::{admit, check_prompt_bytes, check_prompt_len, submit_prompts, within};
use crate::logprobs::MAX_TOP_LOGPROBS;
use crate::openai_types::CompletionRequest;
use crate::response::respond;
use crate::sampling::{DefaultMaxTokens, SamplingPlan, MAX_N};
use crate::state::{AppState, Arrival};

/// OpenAI's and vLLM's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// Most engine sequences one request may start (prompts x `best_of`).
pub const MAX_SEQUENCES: usize = MAX_PROMPTS;

/// A validated completions request, before its prompts are read.
#[derive(Debug)]
struct CompletionPlan {
    sampling: SamplingPlan,
    echo: bool,
    /// `logprobs`: alternatives per token.
    logprobs: Option<usize>,
    /// Sequences per prompt (>= `sampling.n`).
    best_of: usize,
}

pub async fn completions(
    State(state): State<AppState>,
    Arrival(arrival): Arrival,
    tenant: crate::tenant::Tenant,
    headers: HeaderMap,
    OpenAiJson(req): OpenAiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let info = state.engine.info().clone();
    let plan = check_request(&req, info.vocab_size)?;
    // Structured outputs: vLLM's guided_* / structured_outputs fields (a
    // raw prompt has no reasoning block to wait for).
    let grammar = crate::structured::from_guided(&req.guided)?;
    let prompts = parse_prompts(&req.prompt, info.vocab_size)?;
    check_sequences(prompts.len(), plan.best_of)?;
    for p in &prompts {
        if let PromptInput::Text(text) = p {
            check_prompt_bytes(&state, text.len(), "prompt")?;
        }
    }
    let (session_id, cache_salt) =
        crate::sessions::request_scope(&state, &tenant, req.session_id.as_deref(), req.cache_salt.as_deref(), &headers)?;
    if session_id.is_some() && prompts.len() > 1 {
        return Err(ApiError::bad_request(
            format!("a session continues one prompt; this request has {} prompts", prompts.len()),
            Some("session_id"),
        ));
    }
    let admitted = admit(&state, arrival, "cmpl").await?;
    let echo = plan.echo;
    let skip_special = req.sampling.skip_special_tokens.unwrap_or(true);
    let engine = state.engine.clone();
    let add_special = req.add_special_tokens.unwrap_or(true);
    type Prepared = (Vec<(Vec<u32>, Option<String>)>, Option<(kvc_engine::Constraint, kvc_engine::CompiledGrammar)>);
    let prepare = tokio::task::spawn_blocking(move || -> Result<Prepared, ApiError> {
        let compiled = grammar.map(|g| g.compile(&engine, kvc_engine::ReasoningGate::Off)).transpose()?;
        let tokenizer = engine.tokenizer();
        let prompts = prompts
            .into_iter()
            .map(|prompt| match prompt {
                PromptInput::Tokens(ids) => {
                    let echoed = if echo { Some(tokenizer.decode(&ids, skip_special).map_err(ApiError::completion_engine)?) } else { None };
                    Ok((ids, echoed))
                }
                PromptInput::Text(text) => {
                    let ids = tokenizer.encode(&text, add_special).map_err(ApiError::completion_engine)?;
                    Ok((ids, echo.then_some(text)))
                }
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok((prompts, compiled))
    });
    let (prompts, compiled) =
        within(&state, admitted.deadline(), prepare).await?.map_err(|e| ApiError::Internal(format!("tokenization failed: {e}")))??;
    for (ids, _) in &prompts {
        check_prompt_len(&state, ids.len(), "prompt")?;
    }

    let (constraint, grammar) = compiled.unzip();
    let n = plan.sampling.n;
    let mut echoed = Vec::new();
    let mut subs = Vec::with_capacity(prompts.len());
    for (ids, text) in prompts {
        let mut sampling = plan.sampling.params_for(ids.len(), info.max_model_len, DefaultMaxTokens::Fixed(DEFAULT_MAX_TOKENS));
        sampling.constraint = constraint.clone();
        if echo && plan.logprobs.is_some() {
            // vLLM: prompt_logprobs = logprobs with echo.
            sampling.prompt_logprobs = plan.logprobs;
        }
        if plan.best_of > n {
            // Candidates are ranked by their tokens' logprobs.
            sampling.logprobs = Some(plan.logprobs.unwrap_or(0));
        }
        if let Some(text) = text {
            echoed.push(EchoedPrompt { text, tokens: ids.clone() });
        }
        subs.push(Submission {
            prompt_tokens: ids,
            sampling,
            n: plan.best_of,
            session_id: session_id.clone(),
            cache_salt: cache_salt.clone(),
            grammar: grammar.clone(),
            map_err: ApiError::completion_engine,
        });
    }
    let prompt_count = subs.len();
    let generation = submit_prompts(&state, admitted, subs).await?;
    let shape = CompletionShape { n, best_of: plan.best_of, echo: echoed, logprobs: plan.logprobs.is_some() };
    let endpoint = CompletionEndpoint::new(
        generation.request_id().to_string(),
        (info.id, info.fingerprint),
        prompt_count,
        shape,
        Arc::new(state.engine.clone()),
    );
    respond(&state, generation, endpoint, &plan.sampling).await
}

fn check_request(req: &CompletionRequest, vocab_size: usize) -> Result<CompletionPlan, ApiError> {
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad_request(format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"), Some("logprobs")))
        }
    };
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix"));
    }
    let echo = req.echo == Some(true);
    // max_tokens 0 scores the prompt without generating: only with echo,
    // which returns what was scored (vLLM; without echo it is a 400 there too).
    let score_only = match req.sampling.max_tokens {
        Some(0) if echo => true,
        Some(0) => {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1, got 0 (0 is allowed with echo: the prompt is scored, nothing generated)",
                Some("max_tokens"),
            ))
        }
        _ => false,
    };
    let max_tokens = req.sampling.max_tokens.filter(|_| !score_only).map(|m| (m, "max_tokens"));
    let mut sampling = SamplingPlan::new(&req.sampling, max_tokens, vocab_size)?;
    if score_only {
        sampling.set_score_only();
    }
    sampling.set_logprobs(logprobs);
    let n = sampling.n;
    let best_of = match req.best_of {
        None => n,
        Some(b) if !(1..=MAX_N).contains(&b) => {
            return Err(ApiError::bad_request(format!("best_of must be between 1 and {MAX_N}, got {b}"), Some("best_of")))
        }
        Some(b) if (b as usize) < n => {
            return Err(ApiError::bad_request(format!("best_of must be at least n ({n}), got {b}"), Some("best_of")))
        }
        Some(b) => b as usize,
    };
    if sampling.stream && best_of > n {
        // The best choices are known only once every candidate has ended.
        return Err(ApiError::bad_request("best_of greater than n cannot be streamed", Some("best_of")));
    }
    Ok(CompletionPlan { sampling, echo, logprobs, best_of })
}

/// Refuses a request that would start more than [`MAX_SEQUENCES`] engine
/// sequences.
fn check_sequences(prompts: usize, best_of: usize) -> Result<(), ApiError> {
    let total = prompts.saturating_mul(best_of);
    if total > MAX_SEQUENCES {
        let param = if prompts > 1 { "prompt" } else { "best_of" };
        return Err(ApiError::bad_request(
            format!("{prompts} prompts x {best_of} sequences each is {total} sequences; at most {MAX_SEQUENCES} are allowed per request"),
            Some(param),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::status_and_param;
    use serde_json::{json, Value};

    #[test]
    fn missing_prompt_is_a_parse_error() {
        assert!(<CompletionRequest as crate::extract::JsonBody>::parse(br#"{"model": "m"}"#).is_err());
    }

    fn check(extra: Value) -> Result<CompletionPlan, (u16, Option<String>)> {
        let mut v = json!({"prompt": "x"});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let req: CompletionRequest = crate::extract::JsonBody::parse(v.to_string().as_bytes()).unwrap();
        check_request(&req, 10).map_err(status_and_param)
    }

    #[test]
    fn unsupported_or_invalid_options_are_400_naming_the_field() {
        assert_eq!(check(json!({"logprobs": 21})).unwrap_err(), (400, Some("logprobs".into())));
        assert_eq!(check(json!({"logprobs": -1})).unwrap_err(), (400, Some("logprobs".into())));
        assert_eq!(check(json!({"suffix": "end"})).unwrap_err(), (400, Some("suffix".into())));
        assert_eq!(check(json!({"max_tokens": 0})).unwrap_err(), (400, Some("max_tokens".into())));
        assert_eq!(check(json!({"max_tokens": -1, "echo": true})).unwrap_err(), (400, Some("max_tokens".into())));
        assert_eq!(check(json!({"best_of": 0})).unwrap_err(), (400, Some("best_of".into())));
        assert_eq!(check(json!({"best_of": 129})).unwrap_err(), (400, Some("best_of".into())));
        assert_eq!(check(json!({"best_of": 1, "n": 2})).unwrap_err(), (400, Some("best_of".into())));
        assert_eq!(check(json!({"best_of": 3, "n": 2, "stream": true})).unwrap_err(), (400, Some("best_of".into())));
        assert!(check(json!({"echo": true, "suffix": "", "best_of": 1, "logprobs": null})).is_ok());
        assert!(check(json!({"logprobs": 5, "n": 2, "best_of": 2, "stream": true})).is_ok());
    }

    #[test]
    fn scoring_options_are_accepted() {
        // lm-eval's loglikelihood request: echo, logprobs, max_tokens 1 or 0.
        let p = check(json!({"echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0})).unwrap();
        assert!(p.echo && p.logprobs == Some(1) && p.best_of == 1);
        let p = check(json!({"echo": true, "logprobs": 0, "max_tokens": 0})).unwrap();
        assert_eq!(p.sampling.params_for(5, 100, DefaultMaxTokens::Fixed(16)).max_tokens, 0);
        let p = check(json!({"best_of": 4, "n": 2})).unwrap();
        assert_eq!((p.best_of, p.sampling.n), (4, 2));
        assert_eq!(check(json!({})).unwrap().best_of, 1);
    }

    #[test]
    fn too_many_sequences_are_refused() {
        assert!(check_sequences(MAX_SEQUENCES, 1).is_ok());
        assert_eq!(status_and_param(check_sequences(MAX_SEQUENCES, 2).unwrap_err()), (400, Some("prompt".into())));
        assert!(check_sequences(1, MAX_N as usize).is_ok());
    }
}
