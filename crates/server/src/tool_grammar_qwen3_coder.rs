//! The grammar that forces a Qwen3-Coder tool call (`tool_choice`
//! `"required"` or a named function under `--tool-call-parser
//! qwen3_coder`), in the XML layout its chat template teaches and
//! [`crate::tool_parser_qwen3_coder`] parses:
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
//! Parameters come in the order of the schema's `properties`, the
//! `required` ones always, the others optionally. A value is typed where
//! that is simple (`integer`, `number`, `boolean` as the JSON spellings);
//! any other type is any text not containing `</parameter>` (the format has
//! no escape), ended by the first `</parameter>`. Calls are one, or one or
//! more separated by a newline when `parallel_tool_calls` allows and no
//! function is named (as [`crate::structured::tool_call_grammar`]).

use serde_json::{Map, Value};

use kvc_engine::Grammar;

use crate::error::ApiError;
use crate::structured::{sized, GrammarRequest};

/// The closing of a parameter, newline included.
const VALUE_END: &str = "\n</parameter>\n";

/// A Lark string literal for `s` (JSON's escapes are Lark's).
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The rule a value of this property schema follows.
fn value_rule(schema: Option<&Value>) -> &'static str {
    match schema.and_then(|s| s.get("type")).and_then(Value::as_str) {
        Some("integer") => "int_value",
        Some("number") => "number_value",
        Some("boolean") => "bool_value",
        _ => "text_value",
    }
}

pub fn qwen3_coder_call_grammar(tools: &[Value], name: Option<&str>, parallel: bool) -> Result<GrammarRequest, ApiError> {
    const P: &str = "tool_choice";
    let chosen: Vec<&Map<String, Value>> = tools
        .iter()
        .filter_map(|t| t.get("function").and_then(Value::as_object))
        .filter(|f| name.is_none_or(|n| f.get("name").and_then(Value::as_str) == Some(n)))
        .collect();
    if chosen.is_empty() {
        let n = name.unwrap_or_default();
        return Err(ApiError::bad_request(format!("tool_choice names function {n:?}, which is not in tools"), Some(P)));
    }
    let mut rules = Vec::new();
    for (i, f) in chosen.iter().enumerate() {
        let fname = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let empty = Map::new();
        let params = f.get("parameters");
        let properties = params.and_then(|p| p.get("properties")).and_then(Value::as_object).unwrap_or(&empty);
        let required: Vec<&str> = params
            .and_then(|p| p.get("required"))
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut body = vec![lit(&format!("<function={fname}>\n"))];
        for (j, (key, schema)) in properties.iter().enumerate() {
            let rule = format!("param_{i}_{j}");
            let value = value_rule(Some(schema));
            let end = if value == "text_value" { String::new() } else { format!(" {}", lit(VALUE_END)) };
            rules.push(format!("{rule}: {} {value}{end}", lit(&format!("<parameter={key}>\n"))));
            body.push(if required.contains(&key.as_str()) { rule } else { format!("[{rule}]") });
        }
        body.push(lit("</function>\n"));
        rules.push(format!("call_{i}: {}", body.join(" ")));
    }
    let alternatives: Vec<String> = (0..chosen.len()).map(|i| format!("call_{i}")).collect();
    let start = if name.is_some() || !parallel { "start: tool_call" } else { "start: tool_call (\"\\n\" tool_call)*" };
    let lark = format!(
        "{start}\ntool_call: \"<tool_call>\\n\" ({}) \"</tool_call>\"\n{}\n\
         int_value: /-?(0|[1-9][0-9]*)/\n\
         number_value: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/\n\
         bool_value: \"true\" | \"false\"\n\
         text_value[suffix={}]: /(.|\\n)*/\n",
        alternatives.join(" | "),
        rules.join("\n"),
        lit(VALUE_END),
    );
    sized(GrammarRequest { grammar: Grammar::Lark(lark), param: P }, "tools")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvc_engine::grammar::GrammarCompiler;
    use kvc_engine::tokenizer::TextTokenizer;
    use kvc_engine::ReasoningGate;
    use serde_json::json;
    use std::sync::{Arc, OnceLock};

    fn compiler() -> &'static (GrammarCompiler, Arc<TextTokenizer>) {
        static C: OnceLock<(GrammarCompiler, Arc<TextTokenizer>)> = OnceLock::new();
        C.get_or_init(|| {
            let tok = Arc::new(TextTokenizer::embedded_qwen3().expect("embedded tokenizer"));
            (GrammarCompiler::new(tok.clone(), &tok.eos_token_ids()).unwrap(), tok)
        })
    }

    /// Whether the compiled grammar takes `text` as a whole answer (as
    /// `structured::tests::accepts`).
    fn accepts(g: &GrammarRequest, text: &str) -> bool {
        let (compiler, tok) = compiler();
        let compiled = compiler.compile(&g.constraint(ReasoningGate::Off)).expect("the grammar compiles");
        let mut state = kvc_engine::constrained::ConstraintState::new(compiled);
        for id in tok.encode(text, false).unwrap() {
            if state.is_finished() || state.advance(id).is_err() {
                return false;
            }
        }
        let eos = tok.eos_token_ids()[0];
        state.mask().unwrap().is_some_and(|m| m.is_allowed(eos))
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "write_file", "parameters": {"type": "object",
                "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}, "force": {"type": "boolean"}},
                "required": ["path", "lines"]}}}),
            json!({"type": "function", "function": {"name": "ping"}}),
        ]
    }

    fn call(name: &str, params: &[(&str, &str)]) -> String {
        let params: String = params.iter().map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n")).collect();
        format!("<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
    }

    #[test]
    fn the_forced_call_follows_the_schema_and_types_simple_values() {
        let g = qwen3_coder_call_grammar(&tools(), None, true).unwrap();
        let code = "fn main() {\n    println!(\"a\\\\b\");\n}";
        let full = call("write_file", &[("path", code), ("lines", "3"), ("force", "true")]);
        assert!(accepts(&g, &full), "{full}");
        assert!(accepts(&g, &call("write_file", &[("path", "a.rs"), ("lines", "-12")])));
        assert!(accepts(&g, &call("ping", &[])));
        assert!(accepts(&g, &format!("{}\n{}", call("ping", &[]), call("ping", &[]))), "parallel calls");
        assert!(!accepts(&g, &call("write_file", &[("path", "a.rs"), ("lines", "three")])), "an integer is digits");
        assert!(!accepts(&g, &call("write_file", &[("path", "a.rs")])), "a required key is present");
        assert!(!accepts(&g, &call("write_file", &[("path", "a.rs"), ("lines", "1"), ("force", "yes")])));
        assert!(!accepts(&g, &call("other", &[])), "only defined tools");
        assert!(!accepts(&g, "Sure."), "a call is forced");
    }

    #[test]
    fn a_named_function_or_no_parallel_calls_allows_exactly_one_call() {
        let two = format!("{}\n{}", call("ping", &[]), call("ping", &[]));
        let single = qwen3_coder_call_grammar(&tools(), None, false).unwrap();
        assert!(accepts(&single, &call("ping", &[])) && !accepts(&single, &two));
        let named = qwen3_coder_call_grammar(&tools(), Some("ping"), true).unwrap();
        assert!(accepts(&named, &call("ping", &[])) && !accepts(&named, &two));
        assert!(!accepts(&named, &call("write_file", &[("path", "a"), ("lines", "1")])));
        let missing = qwen3_coder_call_grammar(&tools(), Some("nope"), true).unwrap_err();
        assert_eq!(crate::error::error_response(&missing).1.error.param.as_deref(), Some("tool_choice"));
    }
}
