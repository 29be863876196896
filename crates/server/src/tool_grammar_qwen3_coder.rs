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
//! `required` ones always, the others optionally. Values follow the
//! property's schema as far as the format can carry it, read as
//! [`crate::tool_schema_qwen3_coder`] reads it (the parser reads values
//! back the same way):
//!
//! - listed values (`enum`, `const`, and `anyOf` of them with null): one of
//!   them, a string as itself, another value as its JSON;
//! - a value that admits no string (integer, number, boolean, object,
//!   array, null, unions of these; through local `$ref`s): JSON matching
//!   the property's schema, compiled by llguidance (`%json`) in the layout
//!   of the Coder template's `tojson` (`json.dumps` separators); the tool's
//!   `$ref`s still resolve (its `parameters` ride along under `$defs`,
//!   [`PARAMETERS_AT`]);
//! - a string (or a value of unknown type): any text, except text
//!   containing `</parameter>` (the format has no escape: the first one
//!   ends the value) and, unless the schema admits null, the text `null`
//!   in any case (the parser reads it as null). String keywords (`pattern`,
//!   `format`, lengths) are not enforced on raw text, and neither is the
//!   schema of a union that admits a string beside other types.
//!
//! Calls are one, or one or more separated by a newline when
//! `parallel_tool_calls` allows and no function is named (as
//! [`crate::structured::tool_call_grammar`]).

use serde_json::{json, Map, Value};

use kvc_engine::Grammar;

use crate::error::ApiError;
use crate::structured::{call_rules, chosen_tools, rebase_refs, sized, ChosenTool, GrammarRequest};
use crate::tool_schema_qwen3_coder::{value_form, ValueForm};

/// The closing of a parameter, newline included.
const VALUE_END: &str = "\n</parameter>\n";

/// Where a JSON value's schema carries the tool's `parameters`, so that
/// the `$ref`s of both still resolve (rebased onto it).
const PARAMETERS_AT: &str = "#/$defs/kvc_tool_parameters";

/// A Lark string literal for `s` (JSON's escapes are Lark's).
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A listed value as the format writes it: a string raw, else its JSON.
fn written(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// The schema a JSON value of `property` is compiled from: the property's
/// own, and where it (or what it references) uses local `$ref`s, the tool's
/// whole `parameters` under [`PARAMETERS_AT`] with every reference rebased
/// onto it (llguidance resolves a reference from the root of the schema it
/// compiles, now the property's).
fn embedded_schema(property: &Value, parameters: &Value, strict: bool) -> Value {
    let mut schema = property.clone();
    rebase_refs(&mut schema, PARAMETERS_AT);
    if schema != *property {
        let mut carried = parameters.clone();
        rebase_refs(&mut carried, PARAMETERS_AT);
        if let Value::Object(keywords) = &mut schema {
            let defs = keywords.entry("$defs").or_insert_with(|| json!({}));
            if let Value::Object(defs) = defs {
                defs.insert("kvc_tool_parameters".into(), carried);
            }
        }
    }
    kvc_text_front::grammar::with_json_options(schema, strict)
}

/// The rule a value of `property` follows (`rule` names it; rules it
/// needs of its own are added to `rules`), ended by [`VALUE_END`].
fn value_rule(rule: &str, property: &Value, parameters: &Value, strict: bool, rules: &mut Vec<String>) -> Result<String, String> {
    let end = lit(VALUE_END);
    Ok(match value_form(property, parameters) {
        ValueForm::Text { nullable: true } => "text_value".into(),
        ValueForm::Text { nullable: false } => "text_not_null".into(),
        ValueForm::Choice(members) => {
            let alternatives: Vec<String> = members.iter().map(written).filter(|w| !w.contains("</parameter>")).map(|w| lit(&w)).collect();
            if alternatives.is_empty() {
                return Err("lists no value the qwen3_coder format can write".into());
            }
            format!("({}) {end}", alternatives.join(" | "))
        }
        ValueForm::Json => {
            rules.push(format!("{rule}_json: %json {}", embedded_schema(property, parameters, strict)));
            format!("{rule}_json {end}")
        }
    })
}

pub fn qwen3_coder_call_grammar(tools: &[Value], name: Option<&str>, parallel: bool) -> Result<GrammarRequest, ApiError> {
    let chosen = chosen_tools(tools, name)?;
    let mut rules = Vec::new();
    for (i, &ChosenTool { name: fname, strict, function: f }) in chosen.iter().enumerate() {
        let empty = Map::new();
        let parameters = f.get("parameters").cloned().unwrap_or(Value::Null);
        let properties = parameters.get("properties").and_then(Value::as_object).unwrap_or(&empty);
        let required: Vec<&str> =
            parameters.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut body = vec![lit(&format!("<function={fname}>\n"))];
        for (j, (key, schema)) in properties.iter().enumerate() {
            let rule = format!("param_{i}_{j}");
            let value = value_rule(&rule, schema, &parameters, strict, &mut rules)
                .map_err(|why| ApiError::bad_request(format!("tools: parameter {key:?} of {fname:?} {why}"), Some("tools")))?;
            rules.push(format!("{rule}: {} {value}", lit(&format!("<parameter={key}>\n"))));
            body.push(if required.contains(&key.as_str()) { rule } else { format!("[{rule}]") });
        }
        body.push(lit("</function>\n"));
        rules.push(format!("call_{i}: {}", body.join(" ")));
    }
    let (start, alternatives) = call_rules(chosen.len(), name.is_some() || !parallel);
    // Raw text: anything without `</parameter>`, ended lazily by the first
    // VALUE_END; `text_not_null` also refuses `null` in any case.
    let lark = format!(
        "{start}\ntool_call: \"<tool_call>\\n\" ({}) \"</tool_call>\"\n{}\n\
         VALUE_TEXT: /(?s:.*)/ & ~(/(?s:.*)/ \"</parameter>\" /(?s:.*)/)\n\
         VALUE_NOT_NULL: VALUE_TEXT & ~/[nN][uU][lL][lL]/\n\
         text_value[suffix={end}]: VALUE_TEXT\n\
         text_not_null[suffix={end}]: VALUE_NOT_NULL\n",
        alternatives,
        rules.join("\n"),
        end = lit(VALUE_END),
    );
    sized(GrammarRequest { grammar: Grammar::Lark(lark), param: "tool_choice" }, "tools")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::tests::accepts;
    use crate::tool_call_text::{ToolCallStream, ToolOutput};
    use crate::tool_parser_qwen3_coder::Qwen3CoderBlocks;
    use serde_json::json;

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

    /// A tool whose parameters cover the schema shapes the format types.
    fn typed_tool() -> Vec<Value> {
        vec![json!({"type": "function", "function": {"name": "plan", "parameters": {
            "$defs": {
                "Step": {"type": "object", "properties": {"cmd": {"type": "string"}, "retries": {"type": "integer"}},
                         "required": ["cmd"], "additionalProperties": false},
                "Mode": {"enum": ["fast", "slow", 3]}
            },
            "type": "object",
            "properties": {
                "mode": {"$ref": "#/$defs/Mode"},
                "level": {"anyOf": [{"enum": ["low", "high"]}, {"type": "null"}]},
                "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}, "maxItems": 2},
                "first": {"$ref": "#/$defs/Step"},
                "limit": {"type": ["integer", "null"], "minimum": 1},
                "note": {"type": "string"},
                "label": {"type": ["string", "null"]}
            },
            "required": ["mode", "steps"]
        }}})]
    }

    fn plan(params: &[(&str, &str)]) -> String {
        call("plan", params)
    }

    #[test]
    fn listed_values_are_written_raw_or_as_json() {
        let g = qwen3_coder_call_grammar(&typed_tool(), None, false).unwrap();
        for mode in ["fast", "slow", "3"] {
            assert!(accepts(&g, &plan(&[("mode", mode), ("steps", "[]")])), "{mode}");
        }
        for bad in ["medium", "\"fast\"", "3.0", "null"] {
            assert!(!accepts(&g, &plan(&[("mode", bad), ("steps", "[]")])), "{bad}");
        }
        for level in ["low", "high", "null"] {
            assert!(accepts(&g, &plan(&[("mode", "fast"), ("level", level), ("steps", "[]")])), "{level}");
        }
        assert!(!accepts(&g, &plan(&[("mode", "fast"), ("level", "mid"), ("steps", "[]")])));
    }

    #[test]
    fn object_and_array_values_are_json_matching_their_schema_through_refs() {
        let g = qwen3_coder_call_grammar(&typed_tool(), None, false).unwrap();
        let good = [r#"[{"cmd": "make"}, {"cmd": "make test", "retries": 2}]"#, r#"[]"#];
        for steps in good {
            assert!(accepts(&g, &plan(&[("mode", "fast"), ("steps", steps)])), "{steps}");
        }
        assert!(accepts(&g, &plan(&[("mode", "fast"), ("steps", "[]"), ("first", r#"{"cmd": "ls"}"#)])));
        for steps in [
            r#"[{"cmd": "a"}, {"cmd": "b"}, {"cmd": "c"}]"#, // maxItems
            r#"[{"retries": 2}]"#,                           // the referenced definition's required key
            r#"[{"cmd": 1}]"#,
            r#"[{"cmd": "a", "extra": 1}]"#,
            "make",
            "null", // not nullable
        ] {
            assert!(!accepts(&g, &plan(&[("mode", "fast"), ("steps", steps)])), "{steps}");
        }
    }

    #[test]
    fn nullable_values_take_null_and_others_do_not() {
        let g = qwen3_coder_call_grammar(&typed_tool(), None, false).unwrap();
        let with = |extra: (&str, &str)| plan(&[("mode", "slow"), ("steps", "[]"), extra]);
        assert!(accepts(&g, &with(("limit", "null"))));
        assert!(accepts(&g, &with(("limit", "7"))));
        assert!(!accepts(&g, &with(("limit", "0"))), "minimum");
        assert!(accepts(&g, &with(("label", "null"))));
        assert!(accepts(&g, &with(("label", "NULL"))));
        assert!(!accepts(&g, &with(("note", "null"))), "a string that is not nullable is not the text null");
        assert!(!accepts(&g, &with(("note", "Null"))));
        assert!(accepts(&g, &with(("note", "nullable"))));
        assert!(accepts(&g, &with(("note", "null\n"))), "only the whole value is refused");
    }

    #[test]
    fn raw_text_cannot_close_its_parameter_early() {
        let g = qwen3_coder_call_grammar(&typed_tool(), None, false).unwrap();
        let sneaky = "x</parameter>\n<parameter=limit>\n5";
        assert!(!accepts(&g, &plan(&[("mode", "fast"), ("steps", "[]"), ("note", sneaky)])));
        let code = "if a </b> && c <parameter=x> </function>";
        assert!(accepts(&g, &plan(&[("mode", "fast"), ("steps", "[]"), ("note", code)])));
    }

    #[test]
    fn forced_values_parse_back_to_the_values_the_schema_means() {
        let answer = plan(&[
            ("mode", "3"),
            ("level", "null"),
            ("steps", r#"[{"cmd": "make", "retries": 2}]"#),
            ("first", r#"{"cmd": "ls"}"#),
            ("limit", "4"),
            ("note", "3"),
            ("label", "null"),
        ]);
        assert!(accepts(&qwen3_coder_call_grammar(&typed_tool(), None, false).unwrap(), &answer));
        let out = ToolCallStream::parse_all(Qwen3CoderBlocks::new(&typed_tool()), &answer);
        let [ToolOutput::Call(c)] = out.as_slice() else { panic!("{out:?}") };
        let args: Value = serde_json::from_str(&c.arguments).unwrap();
        let expected = json!({"mode": 3, "level": null, "steps": [{"cmd": "make", "retries": 2}], "first": {"cmd": "ls"},
                              "limit": 4, "note": "3", "label": null});
        assert_eq!(args, expected);
        let fast = plan(&[("mode", "fast"), ("level", "high"), ("steps", "[]")]);
        let out = ToolCallStream::parse_all(Qwen3CoderBlocks::new(&typed_tool()), &fast);
        let [ToolOutput::Call(c)] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!(serde_json::from_str::<Value>(&c.arguments).unwrap(), json!({"mode": "fast", "level": "high", "steps": []}));
    }

    #[test]
    fn a_property_with_no_writable_value_is_refused_naming_the_tools() {
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"end": {"enum": ["</parameter>"]}}}}});
        let e = qwen3_coder_call_grammar(&[tool], None, true).unwrap_err();
        assert_eq!(crate::error::error_response(&e).1.error.param.as_deref(), Some("tools"));
        assert!(e.to_string().contains("\"end\""), "{e}");
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
