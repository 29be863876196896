//! What the router reads from a generation request's body without a
//! tokenizer: the session id and estimates of the prompt's tokens and of
//! the tokens the request may generate. Estimates only steer placement;
//! the worker parses and validates the body itself (a malformed body gets
//! the worker's own OpenAI error, passed through).
//!
//! - Prompt tokens: token-id arrays count exactly; text counts as
//!   `ceil(chars / 4)` (about four characters per token for English with
//!   Qwen3's tokenizer), plus [`CHAT_MESSAGE_OVERHEAD`] per chat message and
//!   [`CHAT_REPLY_OVERHEAD`] per request for the template's markers; `tools`
//!   count by their JSON length / 4. Over-estimating is the safe side: the
//!   router then expects a little more load than the worker reports.
//! - Generated tokens: `max_completion_tokens` or `max_tokens`, else
//!   [`DEFAULT_CHAT_MAX_TOKENS`] for chat (the worker's default is the rest
//!   of the context, which would make every request look too big) or 16 for
//!   completions (OpenAI's default); times `n`.

use serde_json::Value;

/// Template tokens around each chat message (`<|im_start|>role\n … <|im_end|>\n`).
pub const CHAT_MESSAGE_OVERHEAD: usize = 5;

/// Template tokens opening the reply (`<|im_start|>assistant\n`).
pub const CHAT_REPLY_OVERHEAD: usize = 3;

/// Generated tokens assumed for a chat request without `max_tokens`.
pub const DEFAULT_CHAT_MAX_TOKENS: usize = 256;

/// Generated tokens of a completions request without `max_tokens`.
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

const CHARS_PER_TOKEN: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Estimate {
    /// The body's `session_id` when it is a string.
    pub session_id: Option<String>,
    /// The body's `cache_salt` when it is a string (it scopes the session).
    pub cache_salt: Option<String>,
    pub prompt_tokens: usize,
    /// Tokens the request may add (`max_tokens` x `n`).
    pub max_tokens: usize,
}

fn text_tokens(s: &str) -> usize {
    s.chars().count().div_ceil(CHARS_PER_TOKEN)
}

/// Tokens of a chat message's `content`: a string or a list of parts.
fn content_tokens(content: &Value) -> usize {
    match content {
        Value::String(s) => text_tokens(s),
        Value::Array(parts) => parts.iter().map(|p| p.get("text").and_then(Value::as_str).map_or(0, text_tokens)).sum(),
        _ => 0,
    }
}

fn chat_prompt_tokens(body: &Value) -> usize {
    let messages = body.get("messages").and_then(Value::as_array).map_or(0, |ms| {
        ms.iter()
            .map(|m| {
                let tool_calls = m.get("tool_calls").map_or(0, |t| text_tokens(&t.to_string()));
                CHAT_MESSAGE_OVERHEAD + m.get("content").map_or(0, content_tokens) + tool_calls
            })
            .sum()
    });
    let tools = body.get("tools").filter(|t| !t.is_null()).map_or(0, |t| text_tokens(&t.to_string()));
    CHAT_REPLY_OVERHEAD + messages + tools
}

/// `prompt`: a string, token ids, or a batch of either.
fn completion_prompt_tokens(prompt: &Value) -> usize {
    match prompt {
        Value::String(s) => text_tokens(s),
        Value::Array(items) if items.iter().all(Value::is_number) => items.len(),
        Value::Array(items) => items.iter().map(completion_prompt_tokens).sum(),
        _ => 0,
    }
}

fn positive(body: &Value, field: &str) -> Option<usize> {
    body.get(field).and_then(Value::as_u64).filter(|&v| v > 0).map(|v| v as usize)
}

/// Reads `body` (any bytes: what is not a JSON object estimates as empty).
pub fn estimate(endpoint: Endpoint, body: &[u8]) -> Estimate {
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return Estimate::default();
    };
    if !body.is_object() {
        return Estimate::default();
    }
    let (prompt_tokens, default_max) = match endpoint {
        Endpoint::Chat => (chat_prompt_tokens(&body), DEFAULT_CHAT_MAX_TOKENS),
        Endpoint::Completions => (body.get("prompt").map_or(0, completion_prompt_tokens), DEFAULT_COMPLETION_MAX_TOKENS),
    };
    let max_tokens = positive(&body, "max_completion_tokens").or_else(|| positive(&body, "max_tokens")).unwrap_or(default_max);
    let n = positive(&body, "n").unwrap_or(1).min(128);
    Estimate {
        session_id: body.get("session_id").and_then(Value::as_str).map(str::to_string),
        cache_salt: body.get("cache_salt").and_then(Value::as_str).map(str::to_string),
        prompt_tokens,
        max_tokens: max_tokens.saturating_mul(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn est(endpoint: Endpoint, v: Value) -> Estimate {
        estimate(endpoint, v.to_string().as_bytes())
    }

    #[test]
    fn chat_counts_text_by_characters_and_messages_by_template_overhead() {
        let e = est(
            Endpoint::Chat,
            json!({"session_id": "s-1", "max_tokens": 10, "n": 2, "messages": [
                {"role": "system", "content": "abcdefgh"},
                {"role": "user", "content": [{"type": "text", "text": "abcde"}]},
            ]}),
        );
        assert_eq!(e.session_id.as_deref(), Some("s-1"));
        assert_eq!(e.prompt_tokens, 3 + (5 + 2) + (5 + 2));
        assert_eq!(e.max_tokens, 20);
    }

    #[test]
    fn chat_without_max_tokens_assumes_the_default() {
        let e = est(Endpoint::Chat, json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7}));
        assert_eq!(e.max_tokens, 7);
        let e = est(Endpoint::Chat, json!({"messages": []}));
        assert_eq!((e.prompt_tokens, e.max_tokens), (CHAT_REPLY_OVERHEAD, DEFAULT_CHAT_MAX_TOKENS));
    }

    #[test]
    fn completions_count_token_ids_exactly() {
        assert_eq!(est(Endpoint::Completions, json!({"prompt": [1, 2, 3]})).prompt_tokens, 3);
        assert_eq!(est(Endpoint::Completions, json!({"prompt": [[1, 2], [3]]})).prompt_tokens, 3);
        assert_eq!(est(Endpoint::Completions, json!({"prompt": ["abcd", "abcdefgh"]})).prompt_tokens, 3);
        let e = est(Endpoint::Completions, json!({"prompt": "abcdefghi"}));
        assert_eq!((e.prompt_tokens, e.max_tokens), (3, DEFAULT_COMPLETION_MAX_TOKENS));
    }

    #[test]
    fn anything_else_estimates_as_empty_for_the_worker_to_refuse() {
        assert_eq!(estimate(Endpoint::Chat, b"{not json"), Estimate::default());
        assert_eq!(estimate(Endpoint::Chat, b"[1,2]"), Estimate::default());
        let e = est(Endpoint::Completions, json!({"prompt": 5, "session_id": 12, "max_tokens": -1}));
        assert_eq!((e.session_id, e.prompt_tokens, e.max_tokens), (None, 0, DEFAULT_COMPLETION_MAX_TOKENS));
    }
}
