//! Which top-level request fields are accepted.
//!
//! OpenAI answers an unknown top-level field with 400 "Unrecognized
//! request argument supplied: X"; vLLM ignores unknown fields. kvc follows
//! OpenAI, because a silently ignored field is a silent wrong answer
//! (a misspelt `max_token`, a `guided_json` that nobody enforces). What is
//! accepted:
//! - the OpenAI fields kvc implements, and the vLLM / SGLang extensions it
//!   implements (`top_k`, `min_p`, `min_tokens`, `repetition_penalty`, `stop_token_ids`,
//!   `ignore_eos`, `skip_special_tokens`, `add_special_tokens`,
//!   `chat_template_kwargs`, `add_generation_prompt`,
//!   `continue_final_message`, `echo`, `session_id`, `cache_salt`, the
//!   structured-output fields `guided_json` / `guided_regex` /
//!   `guided_choice` / `guided_grammar` / `structured_outputs`);
//! - fields that do not change the answer: `user`, `metadata`, `store`,
//!   `service_tier`, `prompt_cache_key`, `safety_identifier`, `request_id`;
//! - any field sent as `null` (clients often send every field).
//!
//! Known fields that kvc does not implement (`guided_decoding_backend`, beam search,
//! `functions`, audio, ...) get 400 "... is not supported yet", unless
//! their value is the one that means "off" (`priority: 0`,
//! `use_beam_search: false`, `parallel_tool_calls: true` on completions,
//! which has no tools, ...).

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::extract::parse_json;

/// The endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    // vLLM / SGLang extensions kvc implements
    "top_k",
    "min_p",
    "min_tokens",
    "repetition_penalty",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "add_special_tokens",
    "session_id",
    "cache_salt",
    "echo",
    // structured outputs (vLLM)
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    // no effect on the answer
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "request_id",
];

const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
];

const COMPLETIONS: &[&str] = &["prompt", "suffix", "best_of"];

/// Known but not implemented, with the value that means "off" (accepted).
fn unsupported(endpoint: Endpoint, field: &str) -> Option<Option<Value>> {
    let off = match field {
        "functions"
        | "function_call"
        | "audio"
        | "prediction"
        | "web_search_options"
        | "reasoning_effort"
        | "verbosity"
        | "guided_decoding_backend"
        | "guided_whitespace_pattern"
        | "prompt_logprobs"
        | "truncate_prompt_tokens"
        | "chat_template"
        | "documents"
        | "mm_processor_kwargs"
        | "logits_processors"
        | "kv_transfer_params"
        | "vllm_xargs"
        | "bad_words"
        | "allowed_token_ids"
        | "regex"
        | "ebnf"
        | "json_schema"
        | "lora_path"
        | "tools"
        | "tool_choice" => None,
        "modalities" => Some(json!(["text"])),
        "priority" => Some(json!(0)),
        "length_penalty" => Some(json!(1.0)),
        "include_stop_str_in_output"
        | "use_beam_search"
        | "return_tokens_as_token_ids"
        | "return_token_ids"
        | "no_stop_trim"
        | "return_hidden_states" => Some(json!(false)),
        "spaces_between_special_tokens" | "separate_reasoning" | "stream_reasoning" | "parallel_tool_calls" => Some(json!(true)),
        "best_of" => Some(json!(1)),
        // Completions: only text (chat implements every type).
        "response_format" => Some(json!({"type": "text"})),
        _ => return None,
    };
    // `tools` / `tool_choice` are chat fields; on completions they are known but unsupported.
    if endpoint == Endpoint::Chat && matches!(field, "tools" | "tool_choice") {
        return None;
    }
    Some(off)
}

fn accepted(endpoint: Endpoint, field: &str) -> bool {
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completions => COMPLETIONS,
    };
    COMMON.contains(&field) || own.contains(&field)
}

/// Checks the top-level fields of a JSON object body (already known to
/// parse); the error names the first offending field.
pub fn check_fields(bytes: &[u8], endpoint: Endpoint) -> Result<(), ApiError> {
    let keys: BTreeMap<String, Option<IgnoredAny>> = parse_json(bytes)?;
    let mut values: Option<Map<String, Value>> = None;
    for (field, value) in &keys {
        if value.is_none() || accepted(endpoint, field) {
            continue;
        }
        let Some(off) = unsupported(endpoint, field) else {
            return Err(ApiError::bad_request(format!("Unrecognized request argument supplied: {field}"), Some(field)));
        };
        if let Some(off) = off {
            if values.is_none() {
                values = Some(parse_json(bytes)?);
            }
            if values.as_ref().and_then(|all| all.get(field)) == Some(&off) {
                continue;
            }
        }
        return Err(ApiError::unsupported(field.clone(), field));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;

    fn check(endpoint: Endpoint, body: Value) -> Result<(), (u16, String, Option<String>)> {
        check_fields(body.to_string().as_bytes(), endpoint).map_err(|e| {
            let (status, b) = error_response(&e);
            (status.as_u16(), b.error.message, b.error.param)
        })
    }

    #[test]
    fn implemented_fields_and_extensions_are_accepted() {
        let chat = json!({"model": "m", "messages": [], "top_k": 5, "chat_template_kwargs": {}, "session_id": "s",
                          "user": "u", "metadata": {"a": "b"}, "tools": [], "continue_final_message": true});
        assert!(check(Endpoint::Chat, chat).is_ok());
        assert!(check(Endpoint::Completions, json!({"prompt": "x", "echo": true, "best_of": 1, "ignore_eos": true})).is_ok());
        assert!(check(Endpoint::Completions, json!({"prompt": "x", "min_tokens": 3})).is_ok());
    }

    #[test]
    fn unknown_fields_are_rejected_like_openai() {
        let (status, msg, param) = check(Endpoint::Chat, json!({"messages": [], "max_token": 5})).unwrap_err();
        assert_eq!((status, param.as_deref()), (400, Some("max_token")));
        assert_eq!(msg, "Unrecognized request argument supplied: max_token");
        // Chat-only fields are unknown on completions.
        assert_eq!(check(Endpoint::Completions, json!({"prompt": "x", "messages": []})).unwrap_err().0, 400);
    }

    #[test]
    fn null_fields_count_as_absent() {
        assert!(check(Endpoint::Chat, json!({"messages": [], "functions": null, "whatever": null})).is_ok());
    }

    #[test]
    fn known_unimplemented_fields_are_refused_unless_off() {
        let (_, msg, param) = check(Endpoint::Chat, json!({"messages": [], "guided_decoding_backend": "xgrammar"})).unwrap_err();
        assert!(msg.contains("not supported"), "{msg}");
        assert_eq!(param.as_deref(), Some("guided_decoding_backend"));
        assert!(check(Endpoint::Chat, json!({"messages": [], "guided_json": {"type": "object"}})).is_ok());
        assert!(
            check(Endpoint::Chat, json!({"messages": [], "min_tokens": 0, "use_beam_search": false, "parallel_tool_calls": true})).is_ok()
        );
        // Implemented on chat; completions has no tools.
        assert!(check(Endpoint::Chat, json!({"messages": [], "parallel_tool_calls": false})).is_ok());
        assert!(check(Endpoint::Completions, json!({"prompt": "x", "parallel_tool_calls": true})).is_ok());
        assert_eq!(
            check(Endpoint::Completions, json!({"prompt": "x", "parallel_tool_calls": false})).unwrap_err().2.as_deref(),
            Some("parallel_tool_calls")
        );
        assert_eq!(check(Endpoint::Chat, json!({"messages": [], "priority": 3})).unwrap_err().0, 400);
        assert!(check(Endpoint::Completions, json!({"prompt": "x", "response_format": {"type": "text"}})).is_ok());
        assert_eq!(check(Endpoint::Completions, json!({"prompt": "x", "tools": []})).unwrap_err().2.as_deref(), Some("tools"));
    }
}
