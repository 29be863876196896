//! Structured outputs: the request fields that constrain the answer, turned
//! into one grammar for the engine.
//!
//! - OpenAI: `response_format` `{"type": "json_object"}` and
//!   `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
//!   `tool_choice: "required"` or `{"type": "function", "function":
//!   {"name"}}`: the answer is one or more (one, when named or with
//!   `parallel_tool_calls: false`) tool calls in Qwen3's format,
//!   `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, the
//!   arguments constrained by the tool's `parameters` schema (its local
//!   `$ref`s still resolve: [`rebase_refs`]).
//! - vLLM's extensions: `guided_json`, `guided_regex`, `guided_choice`,
//!   `guided_grammar` (llguidance's Lark dialect, an EBNF), and their newer
//!   spelling `structured_outputs: {json | regex | choice | grammar}`.
//!
//! At most one of these per request (400 otherwise, naming the second).
//! `strict: true` (a schema's, or a tool's `function.strict`) makes
//! keywords the compiler cannot enforce a 400; without it they are ignored.
//! A schema or grammar that does not compile is a 400 naming the field, and
//! so is one whose text is over [`MAX_GRAMMAR_BYTES`] (checked before it is
//! compiled; for tools, the tool-call grammar holding all their
//! `parameters`). Compiling has its own budget too
//! ([`kvc_text_front::grammar::compile_fuel`]); the handlers compile on tokio's
//! blocking pool, never in an engine step.

use serde_json::{json, Map, Value};

use kvc_engine::{CompiledGrammar, Constraint, EngineHandle, Grammar, ReasoningGate};
use kvc_text_front::grammar::{grammar_bytes, MAX_GRAMMAR_BYTES};

use crate::error::ApiError;

/// A grammar and the request field it came from (for error messages).
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarRequest {
    pub grammar: Grammar,
    pub param: &'static str,
}

impl GrammarRequest {
    fn new(grammar: Grammar, param: &'static str) -> Result<Self, ApiError> {
        sized(GrammarRequest { grammar, param }, param)
    }

    /// The engine's constraint, starting where the prompt leaves the
    /// model's reasoning.
    pub fn constraint(&self, reasoning: ReasoningGate) -> Constraint {
        Constraint { grammar: self.grammar.clone(), reasoning }
    }

    /// Compiled by `engine`, starting at `reasoning`: the constraint the
    /// request's sampling carries and the compiled grammar (a 400 naming
    /// the field when the grammar cannot be used, [`compile_error`]).
    pub fn compile(&self, engine: &EngineHandle, reasoning: ReasoningGate) -> Result<(Constraint, CompiledGrammar), ApiError> {
        let constraint = self.constraint(reasoning);
        let compiled = engine.compile_grammar(&constraint).map_err(|e| compile_error(e, self.param))?;
        Ok((constraint, compiled))
    }
}

/// `g` unless its text is over [`MAX_GRAMMAR_BYTES`]: then a 400 naming
/// the limit and `field` (the request field the text came from).
pub(crate) fn sized(g: GrammarRequest, field: &'static str) -> Result<GrammarRequest, ApiError> {
    let bytes = grammar_bytes(&g.grammar);
    if bytes > MAX_GRAMMAR_BYTES {
        let what = if field == "tools" { "the tool-call grammar built from the tools' parameters" } else { "the grammar" };
        return Err(ApiError::GrammarTooLarge {
            message: format!("{field}: {what} is {bytes} bytes, more than the {} KiB this server compiles", MAX_GRAMMAR_BYTES / 1024),
            param: field,
        });
    }
    Ok(g)
}

/// The vLLM extension fields, as sent (any of them may be absent).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct GuidedFields {
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub structured_outputs: Option<Map<String, Value>>,
}

fn json_schema_grammar(schema: &Value, strict: bool, param: &'static str) -> Result<GrammarRequest, ApiError> {
    let schema = match schema {
        // vLLM also takes the schema as a JSON string.
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| ApiError::bad_request(format!("{param} is not a valid JSON schema: {e}"), Some(param)))?
        }
        other => other.clone(),
    };
    if !schema.is_object() && !schema.is_boolean() {
        return Err(ApiError::bad_request(format!("{param} must be a JSON schema object"), Some(param)));
    }
    GrammarRequest::new(Grammar::JsonSchema { schema: schema.to_string(), strict }, param)
}

/// A regex matching exactly one of `choices`.
fn choice_grammar(choices: &[String], param: &'static str) -> Result<GrammarRequest, ApiError> {
    if choices.is_empty() {
        return Err(ApiError::bad_request(format!("{param} must list at least one choice"), Some(param)));
    }
    let alternatives: Vec<String> = choices.iter().map(|c| regex_escape(c)).collect();
    GrammarRequest::new(Grammar::Regex(format!("({})", alternatives.join("|"))), param)
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if "\\.+*?()|[]{}^$#&-~ \t\n\r".contains(ch) {
            match ch {
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                ' ' => out.push(' '),
                _ => {
                    out.push('\\');
                    out.push(ch);
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// `response_format`: `None` for text.
pub fn from_response_format(format: Option<&Value>) -> Result<Option<GrammarRequest>, ApiError> {
    const P: &str = "response_format";
    let Some(format) = format else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarRequest {
            grammar: Grammar::JsonSchema { schema: json!({"type": "object"}).to_string(), strict: false },
            param: P,
        })),
        Some("json_schema") => {
            let spec = format.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ApiError::bad_request("response_format json_schema needs a \"json_schema\" object with a \"schema\"", Some(P))
            })?;
            let schema =
                spec.get("schema").ok_or_else(|| ApiError::bad_request("response_format.json_schema.schema is missing", Some(P)))?;
            let strict = spec.get("strict").and_then(Value::as_bool).unwrap_or(false);
            json_schema_grammar(schema, strict, P).map(Some)
        }
        Some(other) => Err(ApiError::bad_request(
            format!("response_format type must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"),
            Some(P),
        )),
        None => Err(ApiError::bad_request("response_format must be an object with a \"type\"", Some(P))),
    }
}

/// vLLM's `guided_*` and `structured_outputs` fields.
pub fn from_guided(f: &GuidedFields) -> Result<Option<GrammarRequest>, ApiError> {
    let mut found: Vec<GrammarRequest> = Vec::new();
    if let Some(v) = &f.guided_json {
        found.push(json_schema_grammar(v, false, "guided_json")?);
    }
    if let Some(rx) = &f.guided_regex {
        found.push(GrammarRequest::new(Grammar::Regex(rx.clone()), "guided_regex")?);
    }
    if let Some(c) = &f.guided_choice {
        found.push(choice_grammar(c, "guided_choice")?);
    }
    if let Some(g) = &f.guided_grammar {
        found.push(GrammarRequest::new(Grammar::Lark(g.clone()), "guided_grammar")?);
    }
    if let Some(so) = &f.structured_outputs {
        const P: &str = "structured_outputs";
        for (key, v) in so {
            let bad = |what: &str| ApiError::bad_request(format!("structured_outputs.{key} must be {what}"), Some(P));
            match key.as_str() {
                "json" => found.push(json_schema_grammar(v, false, P)?),
                "regex" => found.push(GrammarRequest::new(Grammar::Regex(v.as_str().ok_or_else(|| bad("a string"))?.into()), P)?),
                "grammar" => found.push(GrammarRequest::new(Grammar::Lark(v.as_str().ok_or_else(|| bad("a string"))?.into()), P)?),
                "choice" => {
                    let choices: Vec<String> = serde_json::from_value(v.clone()).map_err(|_| bad("a list of strings"))?;
                    found.push(choice_grammar(&choices, P)?);
                }
                "json_object" if v == &Value::Bool(true) => found.push(GrammarRequest {
                    grammar: Grammar::JsonSchema { schema: json!({"type": "object"}).to_string(), strict: false },
                    param: P,
                }),
                _ if v.is_null() || v == &Value::Bool(false) => {}
                _ => return Err(ApiError::unsupported(format!("structured_outputs.{key}"), P)),
            }
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(ApiError::bad_request(
            format!("only one structured-output constraint per request; got {} and {}", found[0].param, found[1].param),
            Some(found[1].param),
        )),
    }
}

/// Only one of the request's constraints may be set.
pub fn one_of(a: Option<GrammarRequest>, b: Option<GrammarRequest>) -> Result<Option<GrammarRequest>, ApiError> {
    match (a, b) {
        (Some(a), Some(b)) => Err(ApiError::bad_request(
            format!("only one structured-output constraint per request; got {} and {}", a.param, b.param),
            Some(b.param),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// The grammar of `tool_choice: "required"` (`name: None`: one or more
/// calls of any of `tools`, exactly one unless `parallel`) or of a named
/// function (exactly one call of it), in Qwen3's tool-call format. `tools`
/// are already checked ([`crate::chat_messages::tool_mode`]).
pub fn tool_call_grammar(tools: &[Value], name: Option<&str>, parallel: bool) -> Result<GrammarRequest, ApiError> {
    let chosen = chosen_tools(tools, name)?;
    let mut rules = Vec::new();
    for (i, ChosenTool { name: fname, strict, function: f }) in chosen.iter().enumerate() {
        let mut params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => {
                return Err(ApiError::bad_request(
                    format!("tools: the parameters of {fname:?} must be a JSON schema object"),
                    Some("tools"),
                ))
            }
        };
        rebase_refs(&mut params, ARGUMENTS_AT);
        let call = json!({
            "type": "object",
            "properties": {"name": {"const": fname}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        });
        let call = kvc_text_front::grammar::with_json_options(call, *strict);
        rules.push(format!("call_{i}: %json {call}"));
    }
    let (start, alternatives) = call_rules(chosen.len(), name.is_some() || !parallel);
    let lark = format!("{start}\ntool_call: \"<tool_call>\\n\" ({alternatives}) \"\\n</tool_call>\"\n{}\n", rules.join("\n"));
    sized(GrammarRequest { grammar: Grammar::Lark(lark), param: "tool_choice" }, "tools")
}

/// A function a forced tool call may be: its name, `strict`, and its
/// definition (`function` of the tool).
pub(crate) struct ChosenTool<'a> {
    pub name: &'a str,
    pub strict: bool,
    pub function: &'a Map<String, Value>,
}

/// The functions of `tools` a forced call may be: every one
/// (`tool_choice: "required"`, `name: None`) or the named one; a 400 when
/// the name is not among them.
pub(crate) fn chosen_tools<'a>(tools: &'a [Value], name: Option<&str>) -> Result<Vec<ChosenTool<'a>>, ApiError> {
    let chosen: Vec<ChosenTool> = tools
        .iter()
        .filter_map(|t| t.get("function").and_then(Value::as_object))
        .map(|f| ChosenTool {
            name: f.get("name").and_then(Value::as_str).unwrap_or_default(),
            strict: f.get("strict").and_then(Value::as_bool).unwrap_or(false),
            function: f,
        })
        .filter(|f| name.is_none_or(|n| f.function.get("name").and_then(Value::as_str) == Some(n)))
        .collect();
    if chosen.is_empty() {
        let n = name.unwrap_or_default();
        return Err(ApiError::bad_request(format!("tool_choice names function {n:?}, which is not in tools"), Some("tool_choice")));
    }
    Ok(chosen)
}

/// A forced-call grammar's `start` rule and the alternatives of its
/// `tool_call` over `calls` rules `call_0`, `call_1`, ...: exactly one call
/// when `one` (a named function, or no parallel calls), else one or more
/// separated by a newline.
pub(crate) fn call_rules(calls: usize, one: bool) -> (&'static str, String) {
    let alternatives: Vec<String> = (0..calls).map(|i| format!("call_{i}")).collect();
    let start = if one { "start: tool_call" } else { "start: tool_call (\"\\n\" tool_call)*" };
    (start, alternatives.join(" | "))
}

/// Where [`tool_call_grammar`] puts a tool's `parameters` in the call
/// object it builds, as a JSON pointer.
const ARGUMENTS_AT: &str = "#/properties/arguments";

/// Rewrites the document-local `$ref`s (`#`, `#/...`) of a schema that is
/// embedded at `base` (a `#/...` pointer) of another, so that they still
/// resolve: llguidance resolves a `$ref` from the root of the schema it
/// compiles, and a tool's `parameters` (pydantic's `#/$defs/Point`) are no
/// longer that root once wrapped in the call object. Data values (`const`,
/// `enum`, `default`, `examples`) are left alone; the members of name maps
/// (`properties`, `$defs`, ...) are schemas whatever their names (a
/// property may be called `default`). Other references (remote, anchors)
/// are kept: llguidance refuses them as it would unwrapped.
pub(crate) fn rebase_refs(schema: &mut Value, base: &str) {
    let Value::Object(keywords) = schema else { return };
    for (key, value) in keywords.iter_mut() {
        match (key.as_str(), value) {
            ("$ref", Value::String(r)) => {
                if let Some(rebased) = rebased_ref(r, base) {
                    *r = rebased;
                }
            }
            ("const" | "enum" | "default" | "examples", _) => {}
            ("properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" | "dependencies", Value::Object(named)) => {
                named.values_mut().for_each(|s| rebase_refs(s, base));
            }
            (_, value) => rebase_subschemas(value, base),
        }
    }
}

/// The schemas under a keyword: one (`items`, `not`, ...) or a list
/// (`anyOf`, `prefixItems`, ...).
fn rebase_subschemas(value: &mut Value, base: &str) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_subschemas(v, base)),
        other => rebase_refs(other, base),
    }
}

/// `#` and `#/` (the root, as llguidance reads them) become `base`,
/// `#/...` becomes `base/...`; `None` for any other reference.
fn rebased_ref(reference: &str, base: &str) -> Option<String> {
    match reference {
        "#" | "#/" => Some(base.to_string()),
        r => r.strip_prefix('#').filter(|p| p.starts_with('/')).map(|pointer| format!("{base}{pointer}")),
    }
}

/// A grammar the engine could not compile: a 400 naming the field it came
/// from (`tools` for the tool-call grammar: their `parameters` are what
/// failed), other engine errors keep their mapping.
pub fn compile_error(e: kvc_engine::EngineError, param: &'static str) -> ApiError {
    match e {
        kvc_engine::EngineError::InvalidGrammar(msg) if param == "tool_choice" => {
            ApiError::bad_request(format!("tools: the tools' parameters cannot be used as a grammar: {msg}"), Some("tools"))
        }
        kvc_engine::EngineError::InvalidGrammar(msg) => {
            ApiError::bad_request(format!("{param}: the grammar cannot be used: {msg}"), Some(param))
        }
        other => ApiError::Internal(format!("grammar compiler unavailable: {other}")),
    }
}

/// Where the grammar starts, from the part of the assistant turn the prompt
/// already holds (see [`crate::reasoning_parser`]).
pub fn reasoning_gate(assistant_prefix: &str) -> ReasoningGate {
    let (parser, _) = crate::reasoning_parser::ReasoningParser::primed(assistant_prefix);
    if parser.in_content() {
        ReasoningGate::Off
    } else if parser.in_reasoning() {
        ReasoningGate::Open
    } else {
        ReasoningGate::MayOpen
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::error_response;
    use kvc_engine::GrammarCompiler;
    use kvc_text_front::tokenizer::TextTokenizer;
    use std::sync::{Arc, OnceLock};

    fn param(e: ApiError) -> (u16, Option<String>) {
        let (status, body) = error_response(&e);
        (status.as_u16(), body.error.param)
    }

    #[test]
    fn response_format_types_map_to_grammars() {
        assert_eq!(from_response_format(Some(&json!({"type": "text"}))).unwrap(), None);
        let g = from_response_format(Some(&json!({"type": "json_object"}))).unwrap().unwrap();
        assert!(matches!(g.grammar, Grammar::JsonSchema { strict: false, .. }));
        let g = from_response_format(Some(
            &json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object"}}}),
        ))
        .unwrap()
        .unwrap();
        assert!(matches!(g.grammar, Grammar::JsonSchema { strict: true, .. }));
        for bad in [json!({"type": "json_schema"}), json!({"type": "json_schema", "json_schema": {}}), json!({"type": "yaml"}), json!({})] {
            assert_eq!(param(from_response_format(Some(&bad)).unwrap_err()), (400, Some("response_format".into())), "{bad}");
        }
    }

    #[test]
    fn two_constraints_are_refused_naming_the_second() {
        let f = GuidedFields { guided_regex: Some("a+".into()), guided_choice: Some(vec!["x".into()]), ..Default::default() };
        assert_eq!(param(from_guided(&f).unwrap_err()), (400, Some("guided_choice".into())));
        let a = from_response_format(Some(&json!({"type": "json_object"}))).unwrap();
        let b = from_guided(&GuidedFields { guided_regex: Some("a".into()), ..Default::default() }).unwrap();
        assert_eq!(param(one_of(a, b).unwrap_err()), (400, Some("guided_regex".into())));
    }

    #[test]
    fn choices_are_escaped_literals() {
        let g = choice_grammar(&["a.b".into(), "c|d".into()], "guided_choice").unwrap();
        assert_eq!(g.grammar, Grammar::Regex(r"(a\.b|c\|d)".into()));
    }

    #[test]
    fn a_named_tool_must_exist() {
        let tools = [json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})];
        assert!(tool_call_grammar(&tools, Some("f"), true).is_ok());
        assert_eq!(param(tool_call_grammar(&tools, Some("g"), true).unwrap_err()), (400, Some("tool_choice".into())));
    }

    #[test]
    fn a_grammar_over_the_size_limit_is_refused_naming_its_field() {
        let long = "x".repeat(MAX_GRAMMAR_BYTES + 1);
        let big_schema = json!({"type": "string", "description": long});
        let over = |r: Result<Option<GrammarRequest>, ApiError>, field: &str| {
            let e = r.expect_err("an oversized grammar was accepted");
            assert!(e.to_string().contains("512 KiB"), "{e}");
            assert_eq!(crate::error::error_response(&e).1.error.code.as_deref(), Some("grammar_too_large"));
            assert_eq!(param(e), (400, Some(field.to_string())));
        };
        let fmt = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": big_schema}});
        over(from_response_format(Some(&fmt)), "response_format");
        over(from_guided(&GuidedFields { guided_regex: Some(long.clone()), ..Default::default() }), "guided_regex");
        over(from_guided(&GuidedFields { guided_grammar: Some(long.clone()), ..Default::default() }), "guided_grammar");
        over(from_guided(&GuidedFields { guided_json: Some(big_schema.clone()), ..Default::default() }), "guided_json");
        over(from_guided(&GuidedFields { guided_choice: Some(vec![long.clone()]), ..Default::default() }), "guided_choice");
        let so = json!({"regex": long}).as_object().cloned();
        over(from_guided(&GuidedFields { structured_outputs: so, ..Default::default() }), "structured_outputs");
        // Tools: all their parameters together, each under the limit.
        let tool = |i: usize| json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {"type": "object", "description": "y".repeat(MAX_GRAMMAR_BYTES / 4)}}});
        let tools: Vec<Value> = (0..4).map(tool).collect();
        over(tool_call_grammar(&tools, None, true).map(Some), "tools");
        assert!(tool_call_grammar(&tools[..3], None, true).is_ok());
        // At the limit is fine.
        let at = "x".repeat(MAX_GRAMMAR_BYTES);
        assert!(from_guided(&GuidedFields { guided_regex: Some(at), ..Default::default() }).is_ok());
    }

    /// The engine's grammar compiler over the real Qwen3 tokenizer (built
    /// once: the token trie takes some hundreds of milliseconds).
    fn compiler() -> &'static (GrammarCompiler, Arc<TextTokenizer>) {
        static C: OnceLock<(GrammarCompiler, Arc<TextTokenizer>)> = OnceLock::new();
        C.get_or_init(|| {
            let tok = Arc::new(TextTokenizer::embedded_qwen3().expect("embedded tokenizer"));
            (GrammarCompiler::new(tok.clone(), &tok.eos_token_ids()).unwrap(), tok)
        })
    }

    /// Whether the compiled grammar of `g` takes `text` as a whole answer:
    /// fed token by token through the engine's constraint state, it must
    /// not finish early (the state then lets anything through, for
    /// `ignore_eos`) and must end where the grammar allows EOS.
    pub(crate) fn accepts(g: &GrammarRequest, text: &str) -> bool {
        let (compiler, tok) = compiler();
        let compiled = compiler.compile(&g.constraint(ReasoningGate::Off)).expect("the grammar compiles");
        let mut state = kvc_text_front::constrained::ConstraintState::new(compiled);
        for id in tok.encode(text, false).unwrap() {
            if state.is_finished() || state.advance(id).is_err() {
                return false;
            }
        }
        let eos = tok.eos_token_ids()[0];
        state.mask().unwrap().is_some_and(|m| m.is_allowed(eos))
    }

    fn tool(name: &str, parameters: Value) -> Value {
        json!({"type": "function", "function": {"name": name, "strict": true, "parameters": parameters}})
    }

    /// A call block, its JSON in the layout the grammars impose
    /// (`json.dumps` separators).
    fn call(name: &str, arguments: Value) -> String {
        fn dumps(v: &Value) -> String {
            match v {
                Value::Array(items) => format!("[{}]", items.iter().map(dumps).collect::<Vec<_>>().join(", ")),
                Value::Object(o) => {
                    let members: Vec<String> = o.iter().map(|(k, v)| format!("{}: {}", json!(k), dumps(v))).collect();
                    format!("{{{}}}", members.join(", "))
                }
                other => other.to_string(),
            }
        }
        format!("<tool_call>\n{}\n</tool_call>", dumps(&json!({"name": name, "arguments": arguments})))
    }

    /// pydantic's shape: `$defs` at the root, one definition using another.
    fn route_params() -> Value {
        json!({
            "$defs": {
                "Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false},
                "Stop": {"type": "object", "properties": {"at": {"$ref": "#/$defs/Point"}}, "required": ["at"], "additionalProperties": false}
            },
            "type": "object",
            "properties": {"start": {"$ref": "#/$defs/Point"}, "stops": {"type": "array", "items": {"$ref": "#/$defs/Stop"}, "maxItems": 2}},
            "required": ["start", "stops"],
            "additionalProperties": false
        })
    }

    /// Draft-07's `definitions`, and a property named `default` whose
    /// schema is a reference (a name, not the data keyword).
    fn unit_params() -> Value {
        json!({
            "definitions": {"Unit": {"enum": ["#/definitions/Unit", "celsius"]}},
            "type": "object",
            "properties": {"default": {"$ref": "#/definitions/Unit"}},
            "required": ["default"],
            "additionalProperties": false
        })
    }

    #[test]
    fn local_refs_are_rebased_under_the_arguments_and_data_is_not() {
        let mut p = json!({
            "$ref": "#",
            "properties": {"enum": {"$ref": "#/$defs/A"}, "const": {"anyOf": [{"$ref": "#/"}, {"$ref": "other.json#/x"}]}},
            "$defs": {"A": {"items": [{"$ref": "#/definitions/B"}], "default": {"$ref": "#/kept"}, "const": {"$ref": "#"}}},
            "examples": [{"$ref": "#/kept"}]
        });
        rebase_refs(&mut p, ARGUMENTS_AT);
        let expected = json!({
            "$ref": "#/properties/arguments",
            "properties": {"enum": {"$ref": "#/properties/arguments/$defs/A"}, "const": {"anyOf": [{"$ref": "#/properties/arguments"}, {"$ref": "other.json#/x"}]}},
            "$defs": {"A": {"items": [{"$ref": "#/properties/arguments/definitions/B"}], "default": {"$ref": "#/kept"}, "const": {"$ref": "#"}}},
            "examples": [{"$ref": "#/kept"}]
        });
        assert_eq!(p, expected);
    }

    #[test]
    fn parameters_with_local_refs_compile_and_constrain_the_call() {
        let tools = [tool("route", route_params())];
        for name in [None, Some("route")] {
            let g = tool_call_grammar(&tools, name, true).unwrap();
            let good = json!({"start": {"x": 1}, "stops": [{"at": {"x": -2}}]});
            assert!(accepts(&g, &call("route", good)), "{name:?}");
            // The referenced definitions are enforced, not skipped.
            assert!(!accepts(&g, &call("route", json!({"start": {"x": "one"}, "stops": []}))), "{name:?}");
            assert!(!accepts(&g, &call("route", json!({"start": {"x": 1}, "stops": [{"at": {"y": 2}}]}))), "{name:?}");
        }
        let g = tool_call_grammar(&[tool("unit", unit_params())], None, true).unwrap();
        assert!(accepts(&g, &call("unit", json!({"default": "celsius"}))));
        assert!(accepts(&g, &call("unit", json!({"default": "#/definitions/Unit"}))), "an enum value is data, kept as sent");
        assert!(!accepts(&g, &call("unit", json!({"default": "kelvin"}))));
    }

    #[test]
    fn a_recursive_root_ref_compiles_and_nests() {
        let tree = json!({
            "type": "object",
            "properties": {"leaf": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
            "required": ["leaf", "kids"],
            "additionalProperties": false
        });
        let g = tool_call_grammar(&[tool("tree", tree)], Some("tree"), true).unwrap();
        assert!(accepts(&g, &call("tree", json!({"leaf": 1, "kids": [{"leaf": 2, "kids": [{"leaf": 3, "kids": []}]}]}))));
        assert!(!accepts(&g, &call("tree", json!({"leaf": 1, "kids": [{"leaf": 2}]}))), "a nested tree needs its own kids");
    }

    #[test]
    fn each_tool_keeps_its_own_definitions() {
        // The same definition name, two meanings.
        let a = json!({"$defs": {"V": {"type": "integer"}}, "type": "object", "properties": {"v": {"$ref": "#/$defs/V"}},
                       "required": ["v"], "additionalProperties": false});
        let b = json!({"$defs": {"V": {"type": "boolean"}}, "type": "object", "properties": {"v": {"$ref": "#/$defs/V"}},
                       "required": ["v"], "additionalProperties": false});
        let g = tool_call_grammar(&[tool("a", a), tool("b", b), tool("route", route_params())], None, true).unwrap();
        let (a_ok, b_ok) = (call("a", json!({"v": 3})), call("b", json!({"v": true})));
        assert!(accepts(&g, &format!("{a_ok}\n{b_ok}")));
        assert!(!accepts(&g, &call("a", json!({"v": true}))));
        assert!(!accepts(&g, &call("b", json!({"v": 3}))));
    }

    #[test]
    fn without_parallel_calls_required_allows_exactly_one_call() {
        let tools = [tool("route", route_params()), tool("unit", unit_params())];
        let one = call("unit", json!({"default": "celsius"}));
        let two = format!("{one}\n{}", call("route", json!({"start": {"x": 1}, "stops": []})));
        let parallel = tool_call_grammar(&tools, None, true).unwrap();
        assert!(accepts(&parallel, &one) && accepts(&parallel, &two));
        let single = tool_call_grammar(&tools, None, false).unwrap();
        assert!(accepts(&single, &one));
        assert!(!accepts(&single, &two));
    }

    #[test]
    fn the_gate_follows_the_prompts_reasoning_state() {
        assert_eq!(reasoning_gate(""), ReasoningGate::MayOpen);
        assert_eq!(reasoning_gate("<think>\n"), ReasoningGate::Open);
        assert_eq!(reasoning_gate("<think>\n\n</think>\n\n"), ReasoningGate::Off);
    }
}
