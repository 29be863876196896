//! `POST /v1/chat/completions`: messages -> chat template -> tokens ->
//! engine -> `chat.completion` (or a stream of `chat.completion.chunk`),
//! with reasoning and tool calls parsed out of the answer
//! ([`crate::chat_output`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use crate::backend::Submission;
use crate::chat_messages::{
    cut_after_final_message, final_message_to_continue, open_assistant_turn, template_messages, tool_mode, ToolMode,
};
use crate::chat_output::{ChatEndpoint, ChatSpec};
use crate::error::ApiError;
use crate::extract::OpenAiJson;
use crate::generate::{admit, check_prompt_bytes, check_prompt_len, submit, within};
use crate::logprobs::MAX_TOP_LOGPROBS;
use crate::openai_types::ChatCompletionRequest;
use crate::response::respond;
use crate::sampling::{DefaultMaxTokens, SamplingPlan};
use crate::state::{AppState, Arrival};
use crate::structured::{from_guided, from_response_format, one_of, reasoning_gate, tool_call_grammar, GrammarRequest};
use crate::tool_grammar_qwen3_coder::qwen3_coder_call_grammar;
use crate::tool_parser::{ToolCallFormat, ToolParser};

/// A validated chat request.
#[derive(Debug)]
struct ChatPlan {
    sampling: SamplingPlan,
    tools: ToolMode,
    /// `parallel_tool_calls` (OpenAI's, default true): false allows one
    /// tool call per answer.
    parallel_tool_calls: bool,
    logprobs: bool,
    /// The final assistant message's text, when it is continued.
    continue_final: Option<String>,
    echo: bool,
    add_generation_prompt: bool,
    /// Structured outputs: the grammar the answer must match.
    grammar: Option<GrammarRequest>,
}

pub async fn chat_completions(
    State(state): State<AppState>,
    Arrival(arrival): Arrival,
    tenant: crate::tenant::Tenant,
    headers: HeaderMap,
    OpenAiJson(req): OpenAiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let info = state.engine.info().clone();
    let plan = check_request(&req, info.vocab_size, state.tool_call_format)?;
    let floor = *state.message_floor.get_or_init(|| crate::chat_messages::message_token_floor(&state.engine));
    crate::chat_messages::check_message_count(req.messages.len(), floor, state.max_prompt_tokens())?;
    let messages = template_messages(&req.messages)?;
    let (session_id, cache_salt) =
        crate::sessions::request_scope(&state, &tenant, req.session_id.as_deref(), req.cache_salt.as_deref(), &headers)?;
    let admitted = admit(&state, arrival, "chatcmpl").await?;

    // Built before the tools move into the template render.
    let tool_parser = plan
        .tools
        .parses_calls()
        .then(|| ToolParser::new(state.tool_call_format, req.tools.as_deref().unwrap_or_default(), plan.parallel_tool_calls));
    let render_state = state.clone();
    let (add_generation_prompt, continue_final) = (plan.add_generation_prompt, plan.continue_final.clone());
    let grammar = plan.grammar.clone();
    type Prepared = (String, Vec<u32>, Option<(kvc_engine::Constraint, kvc_engine::CompiledGrammar)>);
    let prepare = tokio::task::spawn_blocking(move || -> Result<Prepared, ApiError> {
        let engine = &render_state.engine;
        let template = engine.chat_template().ok_or_else(|| {
            ApiError::bad_request("this model has no chat template; use /v1/completions with a raw prompt instead", Some("messages"))
        })?;
        // With tool_choice "none" the tools are still shown to the model (vLLM).
        let tools = req.tools.map(Value::Array);
        let kwargs = req.chat_template_kwargs.unwrap_or_default();
        let mut prompt = template.render(&messages, tools.as_ref(), add_generation_prompt, &kwargs).map_err(ApiError::chat_engine)?;
        if let Some(final_text) = &continue_final {
            prompt = cut_after_final_message(&prompt, final_text)?;
        }
        check_prompt_bytes(&render_state, prompt.len(), "messages")?;
        let tokens = engine.tokenizer().encode(&prompt, req.add_special_tokens.unwrap_or(false)).map_err(ApiError::chat_engine)?;
        // The grammar starts where the prompt leaves the model's reasoning.
        let compiled = grammar.map(|g| g.compile(engine, reasoning_gate(open_assistant_turn(&prompt)))).transpose()?;
        Ok((prompt, tokens, compiled))
    });
    let (prompt, prompt_tokens, compiled) = within(&state, admitted.deadline(), prepare)
        .await?
        .map_err(|e| ApiError::Internal(format!("prompt preparation failed: {e}")))??;
    check_prompt_len(&state, prompt_tokens.len(), "messages")?;

    let mut sampling = plan.sampling.params_for(prompt_tokens.len(), info.max_model_len, DefaultMaxTokens::RestOfContext);
    let (constraint, grammar) = compiled.unzip();
    sampling.constraint = constraint;
    let n = plan.sampling.n;
    let generation = submit(
        &state,
        admitted,
        Submission { prompt_tokens, sampling, n, session_id, cache_salt, grammar, map_err: ApiError::chat_engine },
    )
    .await?;
    let spec = ChatSpec {
        id: generation.request_id().to_string(),
        model: info.id,
        system_fingerprint: info.fingerprint,
        n,
        prefix: open_assistant_turn(&prompt).to_string(),
        tools: tool_parser,
        calls_finish: !matches!(plan.tools, ToolMode::Named(_)),
        echo: plan.echo,
        logprobs: plan.logprobs,
    };
    let endpoint = ChatEndpoint::new(spec, Arc::new(state.engine.clone()));
    respond(&state, generation, endpoint, &plan.sampling).await
}

/// Validates everything that does not need the prompt.
fn check_request(req: &ChatCompletionRequest, vocab_size: usize, format: ToolCallFormat) -> Result<ChatPlan, ApiError> {
    let logprobs = req.logprobs == Some(true);
    let top_logprobs = match req.top_logprobs {
        None => 0,
        Some(k) if !(0..=MAX_TOP_LOGPROBS).contains(&k) => {
            return Err(ApiError::bad_request(
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
                Some("top_logprobs"),
            ))
        }
        Some(k) if k > 0 && !logprobs => {
            return Err(ApiError::bad_request("when using `top_logprobs`, `logprobs` must be set to true", Some("top_logprobs")))
        }
        Some(k) => k as usize,
    };
    let tools = tool_mode(req.tools.as_deref(), req.tool_choice.as_ref())?;
    let parallel_tool_calls = req.parallel_tool_calls != Some(false);
    let defined = req.tools.as_deref().unwrap_or_default();
    let forced = match &tools {
        ToolMode::Required => Some(None),
        ToolMode::Named(name) => Some(Some(name.as_str())),
        ToolMode::Off | ToolMode::Auto => None,
    };
    let tool_grammar = match (forced, format) {
        (None, _) => None,
        (Some(name), ToolCallFormat::Hermes) => Some(tool_call_grammar(defined, name, parallel_tool_calls)?),
        (Some(name), ToolCallFormat::Qwen3Coder) => Some(qwen3_coder_call_grammar(defined, name, parallel_tool_calls)?),
    };
    let grammar = one_of(one_of(tool_grammar, from_response_format(req.response_format.as_ref())?)?, from_guided(&req.guided)?)?;
    let continue_final = if req.continue_final_message == Some(true) {
        if req.add_generation_prompt == Some(true) {
            return Err(ApiError::bad_request(
                "continue_final_message and add_generation_prompt cannot both be true",
                Some("continue_final_message"),
            ));
        }
        Some(final_message_to_continue(&req.messages)?)
    } else {
        None
    };
    let echo = req.echo == Some(true);
    if echo && continue_final.is_none() {
        return Err(ApiError::bad_request(
            "echo in chat completions returns the continued final message: it needs continue_final_message",
            Some("echo"),
        ));
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
    let mut sampling = SamplingPlan::new(&req.sampling, max_tokens, vocab_size)?;
    sampling.set_logprobs(logprobs.then_some(top_logprobs));
    Ok(ChatPlan {
        sampling,
        tools,
        parallel_tool_calls,
        logprobs,
        add_generation_prompt: continue_final.is_none() && req.add_generation_prompt.unwrap_or(true),
        continue_final,
        echo,
        grammar,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;
    use serde_json::json;

    fn request(v: Value) -> ChatCompletionRequest {
        crate::extract::JsonBody::parse(v.to_string().as_bytes()).unwrap()
    }

    fn check(extra: Value) -> Result<ChatPlan, (u16, Option<String>)> {
        let mut v = json!({"messages": [{"role": "user", "content": "hi"}]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        check_request(&request(v), 1000, ToolCallFormat::Hermes).map_err(|e| {
            let (status, body) = error_response(&e);
            (status.as_u16(), body.error.param)
        })
    }

    #[test]
    fn unsupported_or_invalid_options_are_400_naming_the_param() {
        let param = |extra: Value| check(extra).unwrap_err();
        assert_eq!(param(json!({"top_logprobs": 2})), (400, Some("top_logprobs".into())));
        assert_eq!(param(json!({"logprobs": true, "top_logprobs": 21})), (400, Some("top_logprobs".into())));
        assert_eq!(param(json!({"logprobs": true, "top_logprobs": -1})), (400, Some("top_logprobs".into())));
        assert_eq!(param(json!({"response_format": {"type": "yaml"}})), (400, Some("response_format".into())));
        assert_eq!(param(json!({"response_format": {"type": "json_schema", "json_schema": {}}})), (400, Some("response_format".into())));
        assert_eq!(param(json!({"tool_choice": "required"})), (400, Some("tool_choice".into())));
        assert_eq!(param(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})), (400, Some("guided_regex".into())));
        assert_eq!(param(json!({"max_completion_tokens": 0})), (400, Some("max_completion_tokens".into())));
        assert_eq!(param(json!({"n": 0})), (400, Some("n".into())));
        assert_eq!(param(json!({"echo": true})), (400, Some("echo".into())));
        assert_eq!(param(json!({"continue_final_message": true})), (400, Some("continue_final_message".into())));
    }

    #[test]
    fn supported_options_build_a_plan() {
        let plan = check(json!({"logprobs": true, "top_logprobs": 3, "n": 2, "response_format": {"type": "text"}, "user": "u"})).unwrap();
        assert!(plan.logprobs);
        assert_eq!(plan.sampling.n, 2);
        assert_eq!(plan.sampling.params_for(5, 100, DefaultMaxTokens::RestOfContext).logprobs, Some(3));
        assert!(plan.add_generation_prompt);
        let plan = check(json!({"logprobs": false, "top_logprobs": 0})).unwrap();
        assert_eq!(plan.sampling.params_for(5, 100, DefaultMaxTokens::RestOfContext).logprobs, None);
    }

    #[test]
    fn continuing_a_final_assistant_message_turns_off_the_generation_prompt() {
        let req = request(json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}],
                                 "continue_final_message": true, "echo": true}));
        let plan = check_request(&req, 1000, ToolCallFormat::Hermes).unwrap();
        assert_eq!(plan.continue_final.as_deref(), Some("Sure,"));
        assert!(plan.echo && !plan.add_generation_prompt);
        let both = request(json!({"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": true,
                                  "add_generation_prompt": true}));
        assert!(check_request(&both, 1000, ToolCallFormat::Hermes).is_err());
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let req = request(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "max_completion_tokens": 7}));
        let plan = check_request(&req, 1000, ToolCallFormat::Hermes).unwrap();
        assert_eq!(plan.sampling.params_for(5, 100, DefaultMaxTokens::RestOfContext).max_tokens, 7);
    }
}
