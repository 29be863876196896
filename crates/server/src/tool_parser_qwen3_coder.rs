//! Qwen3-Coder tool calls: XML-style blocks in the answer become OpenAI
//! `tool_calls`, as vLLM's `qwen3_coder` tool parser does.
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Streamed like the Hermes format ([`crate::tool_parser`]), by the same
//! [`crate::tool_call_text::ToolCallStream`]: the same [`ToolOutput`]s, the same layout rules
//! (whitespace right before a block, and after the last block at the end
//! of the answer, is dropped), the same `parallel_tool_calls: false` rule
//! (calls after the first are dropped, malformed blocks are still text).
//! [`Qwen3CoderBlocks`] reads the blocks.
//!
//! Rules:
//! - a value is everything between `<parameter=KEY>` and the first
//!   `</parameter>` after it, less one leading and one trailing newline;
//!   nothing else closes it, so `<parameter=`, `</function>` and
//!   `</tool_call>` written inside code are kept (vLLM also ends a value at
//!   the next `<parameter=` or `</function>`, which cuts such code, and
//!   recovers a forgotten `</parameter>`; here a forgotten one makes the
//!   value run on). A value cannot contain `</parameter>`: the format has
//!   no escape;
//! - outside values, text between the tags is ignored and `</function>`
//!   may be missing before `</tool_call>`, as vLLM's regexes allow; a
//!   block may hold several functions, one call each;
//! - names and keys run to `>` and are trimmed; an empty one, or one with
//!   `<` or a newline (a lost `>`), makes the block malformed;
//! - values are typed by the tool's JSON schema,
//!   `parameters.properties[KEY]`, read through local `$ref`s, `anyOf` /
//!   `oneOf` and type lists as [`crate::tool_schema_qwen3_coder`] reads
//!   them for the grammar of forced calls: a value the schema lists
//!   (`enum`, `const`) is read back as that value (a string member as its
//!   text, another as its JSON); then the text `null` (any case) is `null`
//!   for every key; then the type decides, with vLLM's type names (a list
//!   of types: [`conversion_type`]): string types keep the text; integer and
//!   number types parse (a number with no fraction is an integer) and keep
//!   the text when they do not; booleans are `true`/`false` in any case,
//!   else the text (vLLM gives `false`); object, array and unknown types
//!   parse as JSON, else the text (vLLM also tries Python literals); a key
//!   not in the schema, or a tool not in `tools`, keeps the text. vLLM
//!   reads only `type`; the `$ref`, `anyOf` and `enum` readings are kvc's,
//!   so that forced calls come back as the values their grammar allowed;
//! - `arguments` is a JSON object in the order the keys came (a repeated
//!   key keeps its first place and its last value, as a Python dict);
//! - a block with no function, or malformed, comes back as the text it
//!   was, up to its `</tool_call>`;
//! - a block still open when the answer ends (max_tokens) is parsed if it
//!   has a function and is not inside a name, a key or a value: every
//!   parameter it opened was closed, only `</function>`/`</tool_call>` are
//!   missing; else it is text. vLLM parses it whenever the names are
//!   complete, keeping a value cut mid-way, which would hand a tool a
//!   truncated file;
//! - only `<tool_call>` opens a block: vLLM's whole-answer fallback that
//!   parses a bare `<function=` is not followed (its streaming path does
//!   not either), so streamed and whole answers agree.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::tool_call_text::{BlockFormat, ParsedToolCall, ToolOutput, TOOL_CALL_END, TOOL_CALL_START};
use crate::tool_schema_qwen3_coder::{choices, conversion_type, listed_value, resolve, types};

pub const FUNCTION_START: &str = "<function=";
pub const FUNCTION_END: &str = "</function>";
pub const PARAMETER_START: &str = "<parameter=";
pub const PARAMETER_END: &str = "</parameter>";

/// Where the scanner stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Scan {
    /// Outside blocks: content.
    #[default]
    Outside,
    /// In a block, between functions.
    Block,
    /// After `<function=`, before `>`.
    Name,
    /// In a function, between parameters.
    Function,
    /// After `<parameter=`, before `>`.
    Key,
    /// In a value, before `</parameter>`.
    Value,
    /// Malformed: waiting for `</tool_call>`.
    Broken,
}

/// A function of the open block, its values still text.
#[derive(Debug, Clone)]
struct RawCall {
    name: String,
    params: Vec<(String, String)>,
}

/// The reader of Qwen3-Coder blocks, its values typed by the request's
/// tools.
#[derive(Debug, Clone, Default)]
pub struct Qwen3CoderBlocks {
    /// Tool name -> its schema.
    schemas: HashMap<String, ToolSchema>,
    scan: Scan,
    /// Bytes of the open block already scanned.
    pos: usize,
    /// Start of the name, key or value being read.
    mark: usize,
    /// Functions of the open block.
    open: Vec<RawCall>,
}

impl Qwen3CoderBlocks {
    /// A reader for a request's OpenAI `tools` (they type the values).
    pub fn new(tools: &[Value]) -> Self {
        Self { schemas: schemas(tools), ..Self::default() }
    }

    /// A `<function=` or `<parameter=` ends `skip` bytes past `pos`.
    fn open_name(&mut self, skip: usize, scan: Scan) {
        self.pos += skip;
        self.mark = self.pos;
        self.scan = scan;
    }

    /// No tag yet: the next scan starts where a tag cut off at the end of
    /// `held` could begin.
    fn wait(&mut self, held: &str) -> Option<usize> {
        let mut at = held.len().saturating_sub(LONGEST_TAG - 1).max(self.pos);
        while !held.is_char_boundary(at) {
            at -= 1;
        }
        self.pos = at;
        None
    }

    /// A call with its values typed by the tool's schema.
    fn typed(&self, raw: RawCall) -> ParsedToolCall {
        let schema = self.schemas.get(&raw.name);
        let mut args: Vec<(String, Value)> = Vec::new();
        for (key, text) in raw.params {
            let value = match schema {
                Some(s) => typed_value(&text, s.properties.get(&key), &s.parameters),
                None => typed_value(&text, None, &Value::Null),
            };
            match args.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => args.push((key, value)),
            }
        }
        let fields: Vec<String> = args.iter().map(|(k, v)| format!("{}:{v}", Value::from(k.as_str()))).collect();
        ParsedToolCall { name: raw.name, arguments: format!("{{{}}}", fields.join(",")) }
    }
}

impl BlockFormat for Qwen3CoderBlocks {
    fn open(&mut self) {
        self.scan = Scan::Block;
        self.pos = 0;
    }

    /// Scans the open block `held` from `pos`.
    fn scan(&mut self, held: &str) -> Option<usize> {
        loop {
            let rest = &held[self.pos..];
            match self.scan {
                Scan::Outside => unreachable!("a block is scanned once it opened"),
                Scan::Block => match earliest(rest, &[FUNCTION_START, TOOL_CALL_END]) {
                    Some((i, 0)) => self.open_name(i + FUNCTION_START.len(), Scan::Name),
                    Some((i, _)) => return Some(self.pos + i + TOOL_CALL_END.len()),
                    None => return self.wait(held),
                },
                Scan::Function => match earliest(rest, &[PARAMETER_START, FUNCTION_END, TOOL_CALL_END]) {
                    Some((i, 0)) => self.open_name(i + PARAMETER_START.len(), Scan::Key),
                    Some((i, 1)) => {
                        self.pos += i + FUNCTION_END.len();
                        self.scan = Scan::Block;
                    }
                    Some((i, _)) => return Some(self.pos + i + TOOL_CALL_END.len()),
                    None => return self.wait(held),
                },
                Scan::Name | Scan::Key => {
                    let Some(i) = rest.find(['>', '<', '\n']) else {
                        self.pos = held.len();
                        return None;
                    };
                    let name = held[self.mark..self.pos + i].trim();
                    if rest.as_bytes()[i] != b'>' || name.is_empty() {
                        self.pos = self.mark;
                        self.scan = Scan::Broken;
                        continue;
                    }
                    let name = name.to_string();
                    self.pos += i + 1;
                    if self.scan == Scan::Name {
                        self.open.push(RawCall { name, params: Vec::new() });
                        self.scan = Scan::Function;
                    } else {
                        self.open.last_mut().expect("a key is inside a function").params.push((name, String::new()));
                        self.mark = self.pos;
                        self.scan = Scan::Value;
                    }
                }
                Scan::Value => {
                    let Some(i) = rest.find(PARAMETER_END) else {
                        return self.wait(held);
                    };
                    let raw = &held[self.mark..self.pos + i];
                    let raw = raw.strip_prefix('\n').unwrap_or(raw);
                    let raw = raw.strip_suffix('\n').unwrap_or(raw).to_string();
                    let call = self.open.last_mut().expect("a value is inside a function");
                    call.params.last_mut().expect("a value has a key").1 = raw;
                    self.pos += i + PARAMETER_END.len();
                    self.scan = Scan::Function;
                }
                Scan::Broken => match rest.find(TOOL_CALL_END) {
                    Some(i) => return Some(self.pos + i + TOOL_CALL_END.len()),
                    None => return self.wait(held),
                },
            }
        }
    }

    fn close(&mut self, block: &str) -> Vec<ToolOutput> {
        let parsed = matches!(self.scan, Scan::Block | Scan::Function) && !self.open.is_empty();
        let open = std::mem::take(&mut self.open);
        self.scan = Scan::Outside;
        self.pos = 0;
        if !parsed {
            return vec![ToolOutput::Text(format!("{TOOL_CALL_START}{block}"))];
        }
        open.into_iter().map(|raw| ToolOutput::Call(self.typed(raw))).collect()
    }
}

const LONGEST_TAG: usize = PARAMETER_END.len();
const _: () = assert!(
    LONGEST_TAG >= FUNCTION_START.len()
        && LONGEST_TAG >= FUNCTION_END.len()
        && LONGEST_TAG >= PARAMETER_START.len()
        && LONGEST_TAG >= TOOL_CALL_END.len()
);

/// A tool's `parameters` (the root its `$ref`s resolve in) and its
/// `properties` (or `parameters` itself when it has no `properties`, as
/// vLLM reads it).
#[derive(Debug, Clone)]
struct ToolSchema {
    parameters: Value,
    properties: Map<String, Value>,
}

/// Tool name -> its schema; the first tool of a name wins.
fn schemas(tools: &[Value]) -> HashMap<String, ToolSchema> {
    let mut out = HashMap::new();
    for tool in tools {
        if tool.get("type").is_some_and(|t| t != "function") {
            continue;
        }
        let Some(function) = tool.get("function") else { continue };
        let Some(name) = function.get("name").and_then(Value::as_str) else { continue };
        let parameters = function.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or(Value::Null);
        let properties = match &parameters {
            Value::Object(params) => params.get("properties").and_then(Value::as_object).unwrap_or(params).clone(),
            _ => Map::new(),
        };
        out.entry(name.to_string()).or_insert(ToolSchema { parameters, properties });
    }
    out
}

/// A value's text typed by its property schema (`None`: not in the
/// schema); `root` is the tool's `parameters`, where `$ref`s resolve.
fn typed_value(text: &str, schema: Option<&Value>, root: &Value) -> Value {
    let as_text = || Value::String(text.to_string());
    if let Some(v) = schema.and_then(|s| choices(s, root)).and_then(|members| listed_value(text, &members)) {
        return v;
    }
    if text.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let Some(schema) = schema else { return as_text() };
    let schema = resolve(schema, root).unwrap_or(schema);
    let ty = match schema.get("type") {
        Some(Value::String(t)) => conversion_type(&[t.as_str()]),
        Some(Value::Array(ts)) => conversion_type(&ts.iter().filter_map(Value::as_str).collect::<Vec<_>>()),
        _ => conversion_type(&types(schema, root).unwrap_or_default()),
    };
    let trimmed = text.trim();
    match ty.as_str() {
        "string" | "str" | "text" | "varchar" | "char" | "enum" => as_text(),
        t if ["int", "uint", "long", "short", "unsigned"].iter().any(|p| t.starts_with(p)) => integer(trimmed).unwrap_or_else(as_text),
        t if t.starts_with("num") || t.starts_with("float") => number(trimmed).unwrap_or_else(as_text),
        "boolean" | "bool" | "binary" => match trimmed.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => as_text(),
        },
        _ => serde_json::from_str(text).unwrap_or_else(|_| as_text()),
    }
}

fn integer(text: &str) -> Option<Value> {
    text.parse::<i64>().map(Value::from).or_else(|_| text.parse::<u64>().map(Value::from)).ok()
}

/// A finite number; one with no fraction is an integer (vLLM: `5.0` -> `5`).
fn number(text: &str) -> Option<Value> {
    if let Some(v) = integer(text) {
        return Some(v);
    }
    let f = text.parse::<f64>().ok().filter(|f| f.is_finite())?;
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        return Some(Value::from(f as i64));
    }
    serde_json::Number::from_f64(f).map(Value::Number)
}

/// The first of `tags` in `text`: (offset, index in `tags`).
fn earliest(text: &str, tags: &[&str]) -> Option<(usize, usize)> {
    tags.iter().enumerate().filter_map(|(k, tag)| text.find(tag).map(|i| (i, k))).min()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tool_call_text::fixtures::{call, merged, splits, text};
    use crate::tool_call_text::ToolCallStream;

    type Qwen3CoderParser = ToolCallStream<Qwen3CoderBlocks>;

    fn tools() -> Vec<Value> {
        let tool = |name: &str, properties: Value| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}});
        vec![
            tool("write_file", json!({"path": {"type": "string"}, "content": {"type": "string"}})),
            tool("get_weather", json!({"city": {"type": "string"}, "days": {"type": "integer"}})),
            tool(
                "search",
                json!({
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "min_score": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array"},
                    "page": {"type": ["integer", "null"]},
                    "note": {"description": "no type: a string"}
                }),
            ),
        ]
    }

    fn parse(answer: &str) -> Vec<ToolOutput> {
        Qwen3CoderParser::parse_all(Qwen3CoderBlocks::new(&tools()), answer)
    }

    /// Pushes `pieces` one at a time, text outputs merged.
    fn stream_with(mut p: Qwen3CoderParser, pieces: &[&str]) -> Vec<ToolOutput> {
        let mut raw: Vec<ToolOutput> = pieces.iter().flat_map(|s| p.push(s)).collect();
        raw.extend(p.finish());
        merged(raw)
    }

    /// Cut in two at every char boundary, and char by char, the answer
    /// streams to `expected`.
    fn assert_every_split(make: impl Fn() -> Qwen3CoderParser, answer: &str, expected: &[ToolOutput]) {
        for pieces in splits(answer) {
            assert_eq!(stream_with(make(), &pieces), expected, "{pieces:?}");
        }
    }

    fn assert_parses_and_streams(answer: &str, expected: &[ToolOutput]) {
        assert_eq!(merged(parse(answer)), expected, "whole: {answer:?}");
        assert_every_split(|| Qwen3CoderParser::new(Qwen3CoderBlocks::new(&tools()), true), answer, expected);
    }

    const WEATHER: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    const WRITE: &str = "<tool_call>\n<function=write_file>\n<parameter=path>\nhello.txt\n</parameter>\n<parameter=content>\nhi\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn one_block_becomes_one_call_with_typed_arguments() {
        assert_parses_and_streams(WEATHER, &[call("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn several_calls_keep_the_text_between_them() {
        let answer = format!("I'll check the weather first.\n\n{WEATHER}\nThen save it.\n{WRITE}\n");
        assert_parses_and_streams(
            &answer,
            &[
                text("I'll check the weather first."),
                call("get_weather", r#"{"city":"Paris","days":3}"#),
                text("\nThen save it."),
                call("write_file", r#"{"path":"hello.txt","content":"hi"}"#),
            ],
        );
        // Back to back, the layout newline between blocks is dropped.
        assert_parses_and_streams(
            &format!("{WEATHER}\n{WRITE}"),
            &[call("get_weather", r#"{"city":"Paris","days":3}"#), call("write_file", r#"{"path":"hello.txt","content":"hi"}"#)],
        );
    }

    #[test]
    fn code_values_are_kept_verbatim_up_to_the_first_close_tag() {
        let code = "fn main() {\n    let re = \"a\\\\d+\\n\";\n    println!(\"{re} </b> <parameter=x> </function> </tool_call>\");\n}\n";
        let answer = format!(
            "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n<parameter=content>\n{code}\n</parameter>\n</function>\n</tool_call>"
        );
        let arguments = format!(r#"{{"path":"src/main.rs","content":{}}}"#, Value::from(code));
        assert_parses_and_streams(&answer, &[call("write_file", &arguments)]);
        // Only one newline is layout on each side; the others are the value's.
        let spaced = "<tool_call>\n<function=write_file>\n<parameter=content>\n\n  x\n\n</parameter>\n</function>\n</tool_call>";
        assert_parses_and_streams(spaced, &[call("write_file", r#"{"content":"\n  x\n"}"#)]);
    }

    #[test]
    fn values_are_typed_by_the_tools_schema() {
        let param = |k: &str, v: &str| format!("<parameter={k}>\n{v}\n</parameter>\n");
        let block = |params: &[(&str, &str)]| {
            let body: String = params.iter().map(|(k, v)| param(k, v)).collect();
            format!("<tool_call>\n<function=search>\n{body}</function>\n</tool_call>")
        };
        let answer = block(&[
            ("query", "42"),
            ("limit", "10"),
            ("min_score", "0.5"),
            ("exact", "True"),
            ("filters", "{\"lang\": \"rust\", \"stars\": 5}"),
            ("tags", "[\"a\", 1]"),
            ("page", "2"),
            ("note", "7"),
            ("unknown", "[1]"),
        ]);
        let expected = r#"{"query":"42","limit":10,"min_score":0.5,"exact":true,"filters":{"lang":"rust","stars":5},"tags":["a",1],"page":2,"note":"7","unknown":"[1]"}"#;
        assert_parses_and_streams(&answer, &[call("search", expected)]);
        // Text that does not fit the type stays text; null is null; 5.0 is 5.
        let answer =
            block(&[("limit", "ten"), ("min_score", "5.0"), ("exact", "yes"), ("filters", "{oops"), ("query", "NULL"), ("limit", "11")]);
        assert_parses_and_streams(&answer, &[call("search", r#"{"limit":11,"min_score":5,"exact":"yes","filters":"{oops","query":null}"#)]);
    }

    #[test]
    fn a_tool_not_in_the_list_keeps_every_value_as_text() {
        let answer = "<tool_call>\n<function=run_tests>\n<parameter=count>\n3\n</parameter>\n<parameter=verbose>\ntrue\n</parameter>\n</function>\n</tool_call>";
        assert_parses_and_streams(answer, &[call("run_tests", r#"{"count":"3","verbose":"true"}"#)]);
        assert_eq!(
            Qwen3CoderParser::parse_all(Qwen3CoderBlocks::new(&[]), WEATHER),
            vec![call("get_weather", r#"{"city":"Paris","days":"3"}"#)]
        );
    }

    #[test]
    fn a_block_cut_off_at_the_end_is_parsed_only_if_no_value_is_open() {
        let weather = call("get_weather", r#"{"city":"Paris","days":3}"#);
        let closed = WEATHER.find("</parameter>\n</function>").unwrap() + "</parameter>".len();
        for cut in [closed, closed + 1, closed + 6, WEATHER.find("</tool_call>").unwrap() + 3] {
            assert_parses_and_streams(&format!("Sure.\n{}", &WEATHER[..cut]), &[text("Sure."), weather.clone()]);
        }
        // Inside a value (maybe a truncated file), a key or the name: text.
        for end in ["\n3\n</param", "\n3", "", "\n3\n</parameter>\n<parameter=", "\n3\n</parameter>\n<parameter=da"] {
            let cut = format!("<tool_call>\n<function=get_weather>\n<parameter=days>{end}");
            assert_parses_and_streams(&cut, &[text(&cut)]);
        }
        assert_parses_and_streams("<tool_call>\n<function=get_wea", &[text("<tool_call>\n<function=get_wea")]);
        assert_parses_and_streams("Hi <tool_ca", &[text("Hi <tool_ca")]);
    }

    #[test]
    fn a_malformed_block_comes_back_as_text() {
        let hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
        let no_name = "<tool_call>\n<function=>\n</function>\n</tool_call>";
        let lost_gt = "<tool_call>\n<function=get_weather\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
        for bad in [hermes, no_name, lost_gt, "<tool_call></tool_call>"] {
            assert_parses_and_streams(bad, &[text(bad)]);
        }
        // A good call after a bad one still parses.
        let answer = format!("{hermes}\n{WEATHER}");
        assert_parses_and_streams(&answer, &[text(hermes), call("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn missing_function_end_and_junk_between_tags_are_tolerated_as_vllm_does() {
        let answer = "<tool_call>\nnote\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\nstray\n</tool_call>";
        assert_parses_and_streams(answer, &[call("get_weather", r#"{"city":"Rome"}"#)]);
        let two = "<tool_call>\n<function=get_weather>\n</function>\n<function=write_file>\n</function>\n</tool_call>";
        assert_parses_and_streams(two, &[call("get_weather", "{}"), call("write_file", "{}")]);
    }

    #[test]
    fn text_without_blocks_passes_through_and_streams_early() {
        for s in ["Hello, world.\n", "a < b and <tool", "<function=f>not a call</function>", "  ", ""] {
            let expected = if s.is_empty() { vec![] } else { vec![text(s)] };
            assert_parses_and_streams(s, &expected);
        }
    }

    #[test]
    fn first_call_only_drops_later_calls_at_any_cut_and_keeps_text() {
        let bad = "<tool_call>\n<function=>\n</tool_call>";
        let answer = format!("Sure.\n{WEATHER}\n{WRITE}\n{bad}\nDone.\n");
        let expected = [text("Sure."), call("get_weather", r#"{"city":"Paris","days":3}"#), text(&format!("{bad}\nDone."))];
        assert_every_split(|| Qwen3CoderParser::new(Qwen3CoderBlocks::new(&tools()), false), &answer, &expected);
        let two_in_one = "<tool_call>\n<function=get_weather>\n</function>\n<function=write_file>\n</function>\n</tool_call>";
        assert_every_split(|| Qwen3CoderParser::new(Qwen3CoderBlocks::new(&tools()), false), two_in_one, &[call("get_weather", "{}")]);
    }

    #[test]
    fn multibyte_text_streams_at_every_char_boundary() {
        let answer =
            "Wetter für Zürich 🌦\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich 🏔\n</parameter>\n</function>\n</tool_call>";
        assert_parses_and_streams(answer, &[text("Wetter für Zürich 🌦"), call("get_weather", r#"{"city":"Zürich 🏔"}"#)]);
    }
}
