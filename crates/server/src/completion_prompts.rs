//! `prompt` of `POST /v1/completions`: a string, a list of strings, a list
//! of token ids, or a list of lists of token ids (OpenAI's and vLLM's
//! shapes). A list of strings or of token lists is a batch: each element
//! is a prompt of its own, answered by its own `n` choices, in order.

use serde_json::Value;

use crate::error::ApiError;

/// Most prompts in one request (each is at least one engine sequence).
pub const MAX_PROMPTS: usize = 1024;

/// One prompt, as text to tokenize or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// Reads `prompt` into its prompts (at least one).
pub fn parse_prompts(v: &Value, vocab_size: usize) -> Result<Vec<PromptInput>, ApiError> {
    let shape_error = || {
        ApiError::bad_request(
            "prompt must be a string, a list of strings, a list of token ids, or a list of lists of token ids",
            Some("prompt"),
        )
    };
    let empty = || ApiError::bad_request("prompt must not be empty", Some("prompt"));
    match v {
        Value::String(s) => Ok(vec![PromptInput::Text(s.clone())]),
        Value::Array(items) if items.is_empty() => Err(empty()),
        Value::Array(items) if items.iter().all(Value::is_number) => Ok(vec![PromptInput::Tokens(token_ids(items, vocab_size)?)]),
        Value::Array(items) if items.len() > MAX_PROMPTS => Err(ApiError::bad_request(
            format!("at most {MAX_PROMPTS} prompts are allowed in one request, got {}", items.len()),
            Some("prompt"),
        )),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            Ok(items.iter().map(|s| PromptInput::Text(s.as_str().unwrap_or_default().to_string())).collect())
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|ids| match ids.as_array() {
                Some(ids) if ids.is_empty() => Err(empty()),
                Some(ids) if ids.iter().all(Value::is_number) => token_ids(ids, vocab_size).map(PromptInput::Tokens),
                _ => Err(shape_error()),
            })
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::status_and_param;
    use serde_json::json;

    #[test]
    fn prompt_accepts_text_ids_and_lists_of_either() {
        use PromptInput::{Text, Tokens};
        assert_eq!(parse_prompts(&json!("hi"), 10).unwrap(), vec![Text("hi".into())]);
        assert_eq!(parse_prompts(&json!([1, 2]), 10).unwrap(), vec![Tokens(vec![1, 2])]);
        assert_eq!(parse_prompts(&json!(["hi"]), 10).unwrap(), vec![Text("hi".into())]);
        assert_eq!(parse_prompts(&json!([[3, 4]]), 10).unwrap(), vec![Tokens(vec![3, 4])]);
        assert_eq!(parse_prompts(&json!(["a", "b"]), 10).unwrap(), vec![Text("a".into()), Text("b".into())]);
        assert_eq!(parse_prompts(&json!([[1], [2, 3]]), 10).unwrap(), vec![Tokens(vec![1]), Tokens(vec![2, 3])]);
    }

    #[test]
    fn bad_prompts_are_400_naming_prompt() {
        for bad in [
            json!([]),
            json!([[]]),
            json!([[1], []]),
            json!(["a", [1]]),
            json!([[1], ["a"]]),
            json!([1, "a"]),
            json!([-1]),
            json!([1.5]),
            json!([10]),
            json!([[10]]),
            json!([5_000_000_000u64]),
            json!(42),
            json!(null),
            json!({"text": "x"}),
            json!([{"text": "x"}]),
            Value::Array(vec![json!("x"); MAX_PROMPTS + 1]),
        ] {
            assert_eq!(status_and_param(parse_prompts(&bad, 10).unwrap_err()), (400, Some("prompt".into())), "{bad}");
        }
        // A long list of token ids is one prompt, not many.
        assert_eq!(parse_prompts(&Value::Array(vec![json!(1); MAX_PROMPTS + 1]), 10).unwrap().len(), 1);
    }
}
