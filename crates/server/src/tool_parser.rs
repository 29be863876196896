//! Qwen3 (Hermes-style) tool calls: `<tool_call>{"name": ..., "arguments":
//! {...}}</tool_call>` blocks in the answer become OpenAI `tool_calls`, as
//! vLLM's `hermes` tool parser does for Qwen models.
//!
//! One streaming parser serves streamed and whole answers alike. Text
//! outside the blocks passes through as content as soon as it cannot be
//! the start of a block; a block is held until `</tool_call>` and then
//! becomes one call.
//!
//! Rules:
//! - a block whose JSON is an object with a string `name` is a call; its
//!   `arguments` (or `parameters`) become a JSON string (an object is
//!   serialized, a string kept as it is, none gives `{}`);
//! - a malformed block (bad JSON, no name) comes back as the text it was,
//!   tags included: the model's mistake is the user's to see, not an error;
//! - a block still open when the answer ends is parsed as if closed (a
//!   model that stops right after the JSON), else returned as text;
//! - whitespace right before a block, and after the last block at the end
//!   of the answer, is layout and dropped (so an answer that is only tool
//!   calls has no content);
//! - with `parallel_tool_calls: false` ([`ToolCallStream::new`])
//!   a block that parses as a call after the first call is dropped (a
//!   malformed one is still text): the answer holds at most one call,
//!   streamed or whole.
//!
//! [`ToolParser`] serves this format and Qwen3-Coder's XML one
//! ([`crate::tool_parser_qwen3_coder`]) behind the same methods; the server
//! picks the format once ([`ToolCallFormat`], `--tool-call-parser`).

use serde_json::Value;

use crate::tool_call_text::{BlockFormat, ParsedToolCall, ToolCallStream, ToolOutput, TOOL_CALL_END, TOOL_CALL_START};
use crate::tool_parser_qwen3_coder::Qwen3CoderBlocks;

/// Hermes blocks: a JSON object between `<tool_call>` and the first
/// `</tool_call>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HermesBlocks;

impl BlockFormat for HermesBlocks {
    fn scan(&mut self, block: &str) -> Option<usize> {
        block.find(TOOL_CALL_END).map(|end| end + TOOL_CALL_END.len())
    }

    fn close(&mut self, block: &str) -> Vec<ToolOutput> {
        match parse_call(block.strip_suffix(TOOL_CALL_END).unwrap_or(block)) {
            Some(call) => vec![ToolOutput::Call(call)],
            None => vec![ToolOutput::Text(format!("{TOOL_CALL_START}{block}"))],
        }
    }
}

/// How a model writes tool calls (vLLM's `--tool-call-parser` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen3).
    #[default]
    Hermes,
    /// `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...`
    /// (Qwen3-Coder).
    Qwen3Coder,
}

impl ToolCallFormat {
    /// vLLM's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Qwen3Coder => "qwen3_coder",
        }
    }

    /// The format a chat template teaches its model: Qwen3-Coder's
    /// templates show tools in the XML style (`<function=` and
    /// `<parameter=`); anything else (no template included) is Hermes.
    pub fn of_template(template: Option<&str>) -> Self {
        match template {
            Some(t) if t.contains("<function=") && t.contains("<parameter=") => Self::Qwen3Coder,
            _ => Self::Hermes,
        }
    }
}

/// A request's tool-call parser, whichever the format: one type for the
/// chat output to hold.
#[derive(Debug, Clone)]
pub enum ToolParser {
    Hermes(ToolCallStream<HermesBlocks>),
    Qwen3Coder(ToolCallStream<Qwen3CoderBlocks>),
}

impl ToolParser {
    /// A parser for `format`, typed by the request's `tools` (Qwen3-Coder
    /// values are text, the schema makes them numbers, booleans, ...);
    /// `parallel: false` keeps the first call only.
    pub fn new(format: ToolCallFormat, tools: &[Value], parallel: bool) -> Self {
        match format {
            ToolCallFormat::Hermes => Self::Hermes(ToolCallStream::new(HermesBlocks, parallel)),
            ToolCallFormat::Qwen3Coder => Self::Qwen3Coder(ToolCallStream::new(Qwen3CoderBlocks::new(tools), parallel)),
        }
    }

    pub fn format(&self) -> ToolCallFormat {
        match self {
            Self::Hermes(_) => ToolCallFormat::Hermes,
            Self::Qwen3Coder(_) => ToolCallFormat::Qwen3Coder,
        }
    }

    /// Calls found so far (kept ones).
    pub fn calls(&self) -> usize {
        match self {
            Self::Hermes(p) => p.calls(),
            Self::Qwen3Coder(p) => p.calls(),
        }
    }

    /// Feeds the next piece of content.
    pub fn push(&mut self, text: &str) -> Vec<ToolOutput> {
        match self {
            Self::Hermes(p) => p.push(text),
            Self::Qwen3Coder(p) => p.push(text),
        }
    }

    /// The answer ended.
    pub fn finish(&mut self) -> Vec<ToolOutput> {
        match self {
            Self::Hermes(p) => p.finish(),
            Self::Qwen3Coder(p) => p.finish(),
        }
    }
}

/// `{"name": "f", "arguments": {...}}` -> a call; anything else -> None.
pub fn parse_call(block: &str) -> Option<ParsedToolCall> {
    let value: Value = serde_json::from_str(block.trim()).ok()?;
    let obj = value.as_object()?;
    let name = obj.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ParsedToolCall { name: name.to_string(), arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_call_text::fixtures::{call, merged, splits, text};

    fn parse_all(answer: &str) -> Vec<ToolOutput> {
        ToolCallStream::parse_all(HermesBlocks, answer)
    }

    /// Pushes `pieces` one at a time, text outputs merged.
    fn stream(pieces: &[&str]) -> Vec<ToolOutput> {
        stream_with(ToolCallStream::new(HermesBlocks, true), pieces)
    }

    fn stream_with(mut p: ToolCallStream<HermesBlocks>, pieces: &[&str]) -> Vec<ToolOutput> {
        let mut raw: Vec<ToolOutput> = pieces.iter().flat_map(|s| p.push(s)).collect();
        raw.extend(p.finish());
        merged(raw)
    }

    const TWO_CALLS: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
                             <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn blocks_become_calls_with_json_string_arguments() {
        assert_eq!(parse_all(TWO_CALLS), vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]);
    }

    #[test]
    fn text_around_calls_is_content_and_layout_whitespace_is_dropped() {
        let answer = format!("Let me check.\n\n{TWO_CALLS}\n");
        assert_eq!(parse_all(&answer), vec![text("Let me check."), call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]);
    }

    #[test]
    fn answer_without_blocks_passes_through_unchanged() {
        for s in ["Hello, world.\n", "a < b and <tool", "  ", ""] {
            let expected = if s.is_empty() { vec![] } else { vec![text(s)] };
            assert_eq!(stream(&[s]), expected, "{s:?}");
        }
    }

    #[test]
    fn malformed_json_comes_back_as_text() {
        let bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>";
        assert_eq!(parse_all(bad), vec![text(bad)]);
        let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
        assert_eq!(parse_all(no_name), vec![text(no_name)]);
        // A good call after a bad one still parses.
        let mixed = format!("{no_name}<tool_call>{{\"name\": \"g\"}}</tool_call>");
        assert_eq!(parse_all(&mixed), vec![text(no_name), call("g", "{}")]);
    }

    #[test]
    fn unclosed_block_at_the_end_is_parsed_or_returned_as_text() {
        assert_eq!(parse_all("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"), vec![call("f", r#"{"a":1}"#)]);
        assert_eq!(parse_all("<tool_call>\n{\"name\": \"f\", \"argu"), vec![text("<tool_call>\n{\"name\": \"f\", \"argu")]);
    }

    #[test]
    fn string_arguments_are_kept_and_parameters_is_an_alias() {
        assert_eq!(parse_all(r#"<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>"#), vec![call("f", r#"{"x": 1}"#)]);
        assert_eq!(parse_all(r#"<tool_call>{"name": "f", "parameters": {"y": [1, 2]}}</tool_call>"#), vec![call("f", r#"{"y":[1,2]}"#)]);
    }

    #[test]
    fn any_cut_of_the_stream_gives_the_same_result() {
        let answer = format!("Sure.\n{TWO_CALLS}\nDone.");
        let whole = parse_all(&answer);
        assert_eq!(whole.len(), 4);
        for pieces in splits(&answer) {
            assert_eq!(stream(&pieces), whole, "{pieces:?}");
        }
    }

    #[test]
    fn in_either_format_content_streams_before_a_block_and_the_call_arrives_when_it_closes() {
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let blocks = [
            (ToolCallFormat::Hermes, "{\"name\": ", "\"f\"}\n</tool_call>"),
            (ToolCallFormat::Qwen3Coder, "<function=f>\n", "</function>\n</tool_call>\n"),
        ];
        for (format, open, close) in blocks {
            let mut p = ToolParser::new(format, &tools, true);
            assert_eq!(p.push("Checking"), vec![text("Checking")], "{format:?}");
            // A cut tag is held, with the layout before it.
            assert_eq!(p.push(" now\n<tool_"), vec![text(" now")], "{format:?}");
            assert_eq!(p.push(&format!("call>\n{open}")), vec![], "{format:?}");
            assert_eq!(p.push(close), vec![call("f", "{}")], "{format:?}");
            assert_eq!(p.finish(), vec![], "{format:?}");
            assert_eq!(p.calls(), 1, "{format:?}");
        }
    }

    #[test]
    fn first_call_only_drops_later_calls_at_any_cut_and_keeps_text() {
        let bad = "<tool_call>{\"arguments\": {}}</tool_call>";
        let answer = format!("Sure.\n{TWO_CALLS}\n{bad}\nDone.\n");
        let expected = vec![text("Sure."), call("get_weather", r#"{"city":"Paris"}"#), text(&format!("{bad}\nDone."))];
        for pieces in splits(&answer) {
            assert_eq!(stream_with(ToolCallStream::new(HermesBlocks, false), &pieces), expected, "{pieces:?}");
        }
        // The one call of an answer that is only calls, and no content.
        assert_eq!(
            stream_with(ToolCallStream::new(HermesBlocks, false), &[TWO_CALLS, "\n"]),
            vec![call("get_weather", r#"{"city":"Paris"}"#)]
        );
    }

    #[test]
    fn a_template_showing_tools_as_xml_picks_qwen3_coder_else_hermes() {
        let coder = "{%- for tool in tools %}<function>{{ tool.name }}</function>{%- endfor %}\n                     <tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>";
        assert_eq!(ToolCallFormat::of_template(Some(coder)), ToolCallFormat::Qwen3Coder);
        let hermes =
            "<tools>{{ tool | tojson }}</tools>\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
        assert_eq!(ToolCallFormat::of_template(Some(hermes)), ToolCallFormat::Hermes);
        // Both markers are needed; no template is Hermes.
        assert_eq!(ToolCallFormat::of_template(Some("<function=f>")), ToolCallFormat::Hermes);
        assert_eq!(ToolCallFormat::of_template(None), ToolCallFormat::Hermes);
    }

    #[test]
    fn the_tool_parser_dispatches_to_the_chosen_format() {
        let tools = [serde_json::json!({"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "note": {"type": "string"}}}}})];
        let xml =
            "<tool_call>\n<function=add>\n<parameter=a>\n7\n</parameter>\n<parameter=note>\nx\n</parameter>\n</function>\n</tool_call>";
        let mut coder = ToolParser::new(ToolCallFormat::Qwen3Coder, &tools, true);
        assert_eq!(coder.format(), ToolCallFormat::Qwen3Coder);
        let mut out = coder.push(xml);
        out.extend(coder.finish());
        assert_eq!(out, vec![call("add", r#"{"a":7,"note":"x"}"#)]);
        assert_eq!(coder.calls(), 1);
        // The Hermes parser leaves the XML block as the text it was.
        let mut hermes = ToolParser::new(ToolCallFormat::Hermes, &tools, true);
        let mut out = hermes.push(xml);
        out.extend(hermes.finish());
        assert_eq!((out, hermes.calls()), (vec![text(xml)], 0));
        // And parses its own; parallel: false keeps one call in both formats.
        let mut single = ToolParser::new(ToolCallFormat::Hermes, &tools, false);
        let mut out = single.push(TWO_CALLS);
        out.extend(single.finish());
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        let mut single = ToolParser::new(ToolCallFormat::Qwen3Coder, &tools, false);
        let mut out = single.push(&format!("{xml}\n{xml}"));
        out.extend(single.finish());
        assert_eq!(out, vec![call("add", r#"{"a":7,"note":"x"}"#)]);
    }
}
