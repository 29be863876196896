//! Chat requests before the template: messages in the shape the template
//! expects, tools and `tool_choice`, and continuing a final assistant
//! message (`continue_final_message`, vLLM's extension).

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai_types::{ChatMessage, MessageContent, Role};
use crate::tool_limit::check_tool_count;

/// How tool calls in the answer are treated.
///
/// `tool_choice: "none"` follows vLLM: the tools are still rendered into
/// the prompt (the model sees what exists) but the answer is not parsed,
/// so any `<tool_call>` stays text. `"required"` and a named function are
/// guaranteed by a grammar ([`crate::structured::tool_call_grammar`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMode {
    /// No tools, or `tool_choice: "none"`.
    Off,
    /// `tool_choice: "auto"` (the default with tools): `<tool_call>` blocks
    /// become `tool_calls`.
    Auto,
    /// `tool_choice: "required"`: one or more calls, nothing else.
    Required,
    /// `tool_choice: {"type": "function", "function": {"name"}}`: one call
    /// of that function.
    Named(String),
}

impl ToolMode {
    /// `<tool_call>` blocks in the answer become `tool_calls`.
    pub fn parses_calls(&self) -> bool {
        *self != ToolMode::Off
    }
}

/// Checks `tools` (each `{"type": "function", "function": {"name", ...}}`)
/// and `tool_choice` (vLLM's rules: anything but `"none"` needs tools).
pub fn tool_mode(tools: Option<&[Value]>, tool_choice: Option<&Value>) -> Result<ToolMode, ApiError> {
    let tools = tools.unwrap_or_default();
    check_tool_count(tools.len())?;
    for (i, tool) in tools.iter().enumerate() {
        let name = tool.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
        let kind = tool.get("type").and_then(Value::as_str);
        if kind != Some("function") || name.is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(
                format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}"),
                Some("tools"),
            ));
        }
    }
    let choice = match tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).filter(|n| !n.is_empty());
            let Some(name) = name else {
                return Err(ApiError::bad_request(
                    "tool_choice naming a function must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    Some("tool_choice"),
                ));
            };
            if tools.is_empty() {
                return Err(ApiError::bad_request("When using `tool_choice`, `tools` must be set.", Some("tool_choice")));
            }
            return Ok(ToolMode::Named(name.to_string()));
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("tool_choice must be \"none\", \"auto\", \"required\" or a function, got {other}"),
                Some("tool_choice"),
            ))
        }
    };
    match choice {
        Some("none") => Ok(ToolMode::Off),
        Some(_) if tools.is_empty() => Err(ApiError::bad_request("When using `tool_choice`, `tools` must be set.", Some("tool_choice"))),
        Some("auto") => Ok(ToolMode::Auto),
        Some("required") => Ok(ToolMode::Required),
        Some(other) => Err(ApiError::bad_request(
            format!("tool_choice must be \"none\", \"auto\", \"required\" or a function, got {other:?}"),
            Some("tool_choice"),
        )),
        None if tools.is_empty() => Ok(ToolMode::Off),
        None => Ok(ToolMode::Auto),
    }
}

/// The messages as the chat template expects them: OpenAI-shaped objects
/// whose `content` is always a string (text parts joined by newlines, as
/// vLLM does for text-only models), `developer` rendered as `system`.
/// Tokens each message adds to a rendered prompt at the least, whatever
/// its content: the template's per-message framing (Qwen3:
/// `<|im_start|>role\n ... <|im_end|>\n`, 5 tokens). Measured by rendering
/// two and four empty messages (user and assistant in turn): half the
/// mean increment per message, so that a role framed more lightly than the
/// other (down to half the mean) is not overcounted. 0 when the template
/// cannot render them (then no message-count bound applies).
pub fn message_token_floor(engine: &kvc_engine::EngineHandle) -> usize {
    let Some(template) = engine.chat_template() else {
        return 0;
    };
    let convo = |pairs: usize| {
        let m: Vec<Value> =
            (0..pairs).flat_map(|_| [json!({"role": "user", "content": ""}), json!({"role": "assistant", "content": ""})]).collect();
        template
            .render(&Value::Array(m), None, false, &Default::default())
            .ok()
            .and_then(|p| engine.tokenizer().encode(&p, false).ok())
            .map(|t| t.len())
    };
    match (convo(1), convo(2)) {
        (Some(one), Some(two)) if two > one => ((two - one) / 4).min(64),
        _ => 0,
    }
}

/// Refuses a conversation whose messages alone need more than `limit`
/// tokens (`floor` each), before anything is rendered or tokenized: the
/// count it reports is that lower bound ("at least").
pub fn check_message_count(count: usize, floor: usize, limit: usize) -> Result<(), ApiError> {
    let least = count.saturating_mul(floor);
    if floor > 0 && least > limit {
        return Err(ApiError::PromptTooLarge { tokens: least, limit, param: "messages", qualifier: "at least " });
    }
    Ok(())
}

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

/// The last message, checked for `continue_final_message`: an assistant
/// message with text to continue.
pub fn final_message_to_continue(messages: &[ChatMessage]) -> Result<String, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("continue_final_message"));
    let last = messages.last().ok_or_else(|| bad("continue_final_message needs messages"))?;
    if last.role != Role::Assistant {
        return Err(bad("continue_final_message needs the last message to be an assistant message"));
    }
    match &last.content {
        Some(MessageContent::Text(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(MessageContent::Parts(parts)) if parts.iter().any(|p| p.text.as_deref().is_some_and(|t| !t.trim().is_empty())) => {
            Ok(parts.iter().filter_map(|p| p.text.as_deref()).collect::<Vec<_>>().join("\n"))
        }
        _ => Err(bad("continue_final_message needs the last assistant message to have text to continue")),
    }
}

/// Cuts a prompt rendered without a generation prompt right after the
/// final message's text, so that the model continues it. Qwen3's template
/// rewrites a final message that holds `</think>` (it re-wraps the
/// reasoning), so the text after the last `</think>` is looked for too.
pub fn cut_after_final_message(prompt: &str, final_text: &str) -> Result<String, ApiError> {
    // As transformers: the text as sent if the template kept it verbatim,
    // else without trailing whitespace.
    let answer = final_text.rsplit_once("</think>").map(|(_, a)| a.trim()).filter(|a| !a.is_empty());
    for needle in [final_text, final_text.trim_end()].into_iter().chain(answer) {
        if let Some(at) = prompt.rfind(needle) {
            return Ok(prompt[..at + needle.len()].to_string());
        }
    }
    Err(ApiError::bad_request(
        "continue_final_message: the chat template changed the final message, so it cannot be continued",
        Some("continue_final_message"),
    ))
}

/// Header that opens an assistant turn in Qwen3's (ChatML) template.
const ASSISTANT_HEADER: &str = "<|im_start|>assistant\n";

/// The assistant turn still open at the end of a rendered prompt: the text
/// after the last assistant header, if that turn was not closed (`""`
/// otherwise). The answer's parsers start from it: it holds e.g. the
/// template's `<think>\n\n</think>\n\n` when thinking is off, or a
/// continued message.
pub fn open_assistant_turn(prompt: &str) -> &str {
    match prompt.rfind(ASSISTANT_HEADER) {
        Some(at) => {
            let tail = &prompt[at + ASSISTANT_HEADER.len()..];
            if tail.contains("<|im_end|>") || tail.contains("<|im_start|>") {
                ""
            } else {
                tail
            }
        }
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::status_and_param;
    use crate::openai_types::ChatCompletionRequest;

    fn request(v: Value) -> ChatCompletionRequest {
        crate::extract::JsonBody::parse(v.to_string().as_bytes()).unwrap()
    }

    fn weather_tool() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
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
    fn tool_choice_follows_vllm() {
        let tools = [weather_tool()];
        let mode = |tools: Option<&[Value]>, choice: Value| tool_mode(tools, Some(&choice)).map_err(status_and_param);
        assert_eq!(tool_mode(Some(&tools), None).unwrap(), ToolMode::Auto);
        assert_eq!(tool_mode(None, None).unwrap(), ToolMode::Off);
        assert_eq!(mode(Some(&tools), json!("auto")).unwrap(), ToolMode::Auto);
        assert_eq!(mode(Some(&tools), json!("none")).unwrap(), ToolMode::Off);
        assert_eq!(mode(None, json!("none")).unwrap(), ToolMode::Off);
        assert_eq!(mode(None, json!("auto")).unwrap_err(), (400, Some("tool_choice".into())));
        assert_eq!(mode(Some(&tools), json!("required")).unwrap(), ToolMode::Required);
        assert_eq!(mode(None, json!("required")).unwrap_err(), (400, Some("tool_choice".into())));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(mode(Some(&tools), named.clone()).unwrap(), ToolMode::Named("get_weather".into()));
        assert_eq!(mode(None, named).unwrap_err(), (400, Some("tool_choice".into())));
        assert_eq!(mode(Some(&tools), json!({"type": "function", "function": {}})).unwrap_err(), (400, Some("tool_choice".into())));
        assert_eq!(mode(Some(&tools), json!("sometimes")).unwrap_err().0, 400);
        assert_eq!(mode(Some(&tools), json!(5)).unwrap_err().0, 400);
    }

    #[test]
    fn malformed_tools_are_400_naming_tools() {
        for bad in [
            json!({"type": "function"}),
            json!({"type": "retrieval", "function": {"name": "f"}}),
            json!("f"),
            json!({"type": "function", "function": {"name": ""}}),
        ] {
            assert_eq!(tool_mode(Some(&[bad.clone()]), None).map_err(status_and_param).unwrap_err(), (400, Some("tools".into())), "{bad}");
        }
    }

    #[test]
    fn continuing_needs_a_final_assistant_message_with_text() {
        let msgs = |v: Value| request(json!({"messages": v})).messages;
        assert_eq!(
            final_message_to_continue(&msgs(json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]))).unwrap(),
            "Sure"
        );
        assert!(final_message_to_continue(&msgs(json!([{"role": "user", "content": "hi"}]))).is_err());
        assert!(final_message_to_continue(&msgs(json!([{"role": "assistant", "content": " "}]))).is_err());
    }

    #[test]
    fn prompt_is_cut_right_after_the_continued_text() {
        let rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSure, <|im_end|>\n";
        assert_eq!(
            cut_after_final_message(rendered, "Sure, ").unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSure, "
        );
        assert!(cut_after_final_message(rendered, "Sure, \n").unwrap().ends_with("Sure,"), "trailing whitespace the template dropped");
        // The template re-wrapped the reasoning: the answer part is found.
        let rendered = "<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>\n{<|im_end|>\n";
        assert!(cut_after_final_message(rendered, "<think>plan</think><tool_call>\n{").unwrap().ends_with("<tool_call>\n{"));
        assert_eq!(cut_after_final_message("abc", "xyz").map_err(status_and_param).unwrap_err().0, 400);
    }

    #[test]
    fn open_assistant_turn_is_what_the_prompt_left_unfinished() {
        assert_eq!(open_assistant_turn("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "");
        assert_eq!(open_assistant_turn("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "<think>\n\n</think>\n\n");
        assert_eq!(open_assistant_turn("<|im_start|>assistant\nold<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"), "");
        assert_eq!(open_assistant_turn("plain completion prompt"), "");
    }
}
