//! What a Qwen3-Coder parameter value is, read off the tool's JSON schema:
//! one reading shared by the grammar that forces calls
//! ([`crate::tool_grammar_qwen3_coder`]) and the parser that types their
//! values ([`crate::tool_parser_qwen3_coder`]), so that what the one lets
//! the model write the other reads back as the value the schema means.
//!
//! The format writes a string raw and any other value as JSON (the Coder
//! chat template prints scalars with `string` and objects and arrays with
//! `tojson`). A property schema is read through its local `$ref`s (into
//! the tool's `parameters`), `anyOf` / `oneOf` and type lists:
//!
//! - listed values ([`choices`]: `enum`, `const`, or an `anyOf` / `oneOf`
//!   of those and `{"type": "null"}`, as pydantic writes `Optional[Literal]`)
//!   are written as the format writes them, strings raw, others as JSON;
//! - a value that may be a string (or whose type is not known) is raw text;
//! - any other value (integer, number, boolean, object, array, null, and
//!   unions of them) is JSON text.

use serde_json::Value;

/// Local `$ref`s are followed at most this deep (a cycle stops here).
const MAX_DEPTH: usize = 16;

/// JSON-schema type names; other names (vLLM's `int`, `dict`, ...) are not
/// read here ([`types`] gives `None` for them).
const STANDARD_TYPES: [&str; 7] = ["string", "integer", "number", "boolean", "object", "array", "null"];

/// `schema` with its chain of local `$ref`s followed within `root` (the
/// tool's `parameters`): `#` and `#/` are the root, `#/a/b` a JSON pointer
/// into it. `None` when a reference does not resolve (remote, an anchor,
/// missing, or a cycle).
pub fn resolve<'a>(mut schema: &'a Value, root: &'a Value) -> Option<&'a Value> {
    for _ in 0..MAX_DEPTH {
        let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
            return Some(schema);
        };
        let pointer = reference.strip_prefix('#')?;
        schema = if pointer.is_empty() || pointer == "/" { root } else { root.pointer(pointer)? };
    }
    None
}

/// The values a schema lists, when it lists them: its `const` or `enum`
/// (members of a type the schema's `type` excludes left out), or the union
/// of an `anyOf` / `oneOf` whose branches all list theirs or are
/// `{"type": "null"}`.
pub fn choices(schema: &Value, root: &Value) -> Option<Vec<Value>> {
    choices_at(schema, root, 0)
}

fn choices_at(schema: &Value, root: &Value, depth: usize) -> Option<Vec<Value>> {
    let s = resolve(schema, root).filter(|_| depth < MAX_DEPTH)?;
    let listed = match (s.get("const"), s.get("enum")) {
        (Some(c), _) => Some(vec![c.clone()]),
        (None, Some(Value::Array(members))) => Some(members.clone()),
        _ => None,
    };
    if let Some(mut members) = listed {
        if let Some(types) = declared_types(s) {
            members.retain(|m| types.iter().any(|t| type_admits(t, m)));
        }
        return Some(members);
    }
    if s.get("type").and_then(Value::as_str) == Some("null") {
        return Some(vec![Value::Null]);
    }
    let branches = s.get("anyOf").or_else(|| s.get("oneOf"))?.as_array()?;
    let mut out: Vec<Value> = Vec::new();
    for branch in branches {
        for v in choices_at(branch, root, depth + 1)? {
            if !out.contains(&v) {
                out.push(v);
            }
        }
    }
    Some(out)
}

/// The schema's `type` as a list of names (`None` without one).
fn declared_types(s: &Value) -> Option<Vec<&str>> {
    match s.get("type")? {
        Value::String(t) => Some(vec![t.as_str()]),
        Value::Array(ts) => Some(ts.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn type_admits(t: &str, v: &Value) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => true,
    }
}

/// The JSON type of a value, by JSON-schema name.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The types a value of this schema may have, in the order the schema
/// gives them (its `type`, the types of its listed values, or the union
/// over `anyOf` / `oneOf` branches). `None`: any value, as far as kvc reads
/// the schema (no type, a type name that is not JSON schema's, `allOf`, an
/// unresolvable `$ref`).
pub fn types(schema: &Value, root: &Value) -> Option<Vec<&'static str>> {
    types_at(schema, root, 0)
}

fn types_at(schema: &Value, root: &Value, depth: usize) -> Option<Vec<&'static str>> {
    let s = resolve(schema, root).filter(|_| depth < MAX_DEPTH)?;
    let mut out: Vec<&'static str> = Vec::new();
    let mut add = |t: &'static str| {
        if !out.contains(&t) {
            out.push(t);
        }
    };
    if let Some(names) = declared_types(s) {
        for name in names {
            add(STANDARD_TYPES.iter().copied().find(|t| *t == name)?);
        }
    } else if let Some(members) = choices_at(s, root, depth) {
        members.iter().for_each(|m| add(type_of(m)));
    } else {
        let branches = s.get("anyOf").or_else(|| s.get("oneOf"))?.as_array()?;
        for branch in branches {
            types_at(branch, root, depth + 1)?.into_iter().for_each(&mut add);
        }
    }
    Some(out)
}

/// How a forced call writes a value of a property schema.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueForm {
    /// One of these values: strings raw, the others as JSON.
    Choice(Vec<Value>),
    /// Raw text. The parser reads `null` (any case) as null, so it is
    /// allowed only where the schema admits null (or any value).
    Text { nullable: bool },
    /// JSON text matching the schema (it admits no string).
    Json,
}

pub fn value_form(schema: &Value, root: &Value) -> ValueForm {
    if let Some(members) = choices(schema, root) {
        return ValueForm::Choice(members);
    }
    match types(schema, root) {
        None => ValueForm::Text { nullable: true },
        Some(ts) if ts.contains(&"string") => ValueForm::Text { nullable: ts.contains(&"null") },
        Some(_) => ValueForm::Json,
    }
}

/// A listed value, if `text` is how the format writes one of `members`: a
/// string member as itself (first: `"1"` and `1` both write `1`), another
/// as its JSON.
pub fn listed_value(text: &str, members: &[Value]) -> Option<Value> {
    if let Some(m) = members.iter().find(|m| m.as_str() == Some(text)) {
        return Some(m.clone());
    }
    let v: Value = serde_json::from_str(text).ok()?;
    members.contains(&v).then_some(v)
}

/// The type name a value's text is converted by ([`crate::tool_parser_qwen3_coder`]),
/// from the names a schema gives (its `type`, or [`types`]): with one
/// non-null type, or a list that holds a string or a name JSON schema does
/// not define, the first non-null one (vLLM reads a single type name); a
/// list of numeric types, `number`; any other list (booleans, numbers,
/// objects, arrays), `object`: the text is parsed as JSON, which covers them
/// all. No type: `string`.
pub fn conversion_type(names: &[&str]) -> String {
    let non_null: Vec<String> = names.iter().map(|t| t.trim().to_ascii_lowercase()).filter(|t| t != "null").collect();
    let standard_only = non_null.iter().all(|t| STANDARD_TYPES.contains(&t.as_str()));
    match non_null.as_slice() {
        [] => "string".into(),
        [one] => one.clone(),
        [first, ..] if !standard_only || non_null.iter().any(|t| t == "string") => first.clone(),
        many if many.iter().all(|t| t == "integer" || t == "number") => "number".into(),
        _ => "object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn root() -> Value {
        json!({
            "$defs": {
                "Point": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "Mode": {"enum": ["fast", "slow"]},
                "Alias": {"$ref": "#/$defs/Mode"},
                "Loop": {"$ref": "#/$defs/Loop"}
            },
            "type": "object",
            "properties": {}
        })
    }

    #[test]
    fn refs_resolve_through_chains_and_fail_on_cycles_and_remote_ones() {
        let r = root();
        assert_eq!(resolve(&json!({"$ref": "#/$defs/Alias"}), &r), Some(&json!({"enum": ["fast", "slow"]})));
        assert_eq!(resolve(&json!({"$ref": "#"}), &r), Some(&r));
        assert_eq!(resolve(&json!({"$ref": "#/$defs/Loop"}), &r), None);
        assert_eq!(resolve(&json!({"$ref": "other.json#/x"}), &r), None);
        assert_eq!(resolve(&json!({"$ref": "#/$defs/Nope"}), &r), None);
    }

    #[test]
    fn forms_follow_the_schema_types() {
        let r = root();
        let form = |s: Value| value_form(&s, &r);
        assert_eq!(form(json!({"type": "string"})), ValueForm::Text { nullable: false });
        assert_eq!(form(json!({"type": ["string", "null"]})), ValueForm::Text { nullable: true });
        assert_eq!(form(json!({"anyOf": [{"type": "string"}, {"type": "null"}]})), ValueForm::Text { nullable: true });
        assert_eq!(form(json!({"description": "no type"})), ValueForm::Text { nullable: true });
        assert_eq!(form(json!({"type": "int"})), ValueForm::Text { nullable: true }, "vLLM's names are not constrained");
        for json_valued in [
            json!({"type": "integer"}),
            json!({"type": ["number", "null"]}),
            json!({"type": "object"}),
            json!({"$ref": "#/$defs/Point"}),
            json!({"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]}),
            json!({"oneOf": [{"type": "array"}, {"type": "boolean"}]}),
        ] {
            assert_eq!(form(json_valued.clone()), ValueForm::Json, "{json_valued}");
        }
        assert_eq!(form(json!({"$ref": "#/$defs/Alias"})), ValueForm::Choice(vec![json!("fast"), json!("slow")]));
        assert_eq!(
            form(json!({"anyOf": [{"$ref": "#/$defs/Mode"}, {"const": 3}, {"type": "null"}]})),
            ValueForm::Choice(vec![json!("fast"), json!("slow"), json!(3), Value::Null])
        );
        assert_eq!(form(json!({"type": "string", "enum": ["a", 1, null]})), ValueForm::Choice(vec![json!("a")]), "typed members only");
    }

    #[test]
    fn listed_values_read_back_strings_first_then_json() {
        let members = [json!("1"), json!(1), json!(2.5), json!({"a": [true]}), Value::Null];
        assert_eq!(listed_value("1", &members), Some(json!("1")));
        assert_eq!(listed_value("2.5", &members), Some(json!(2.5)));
        assert_eq!(listed_value("{\"a\": [true]}", &members), Some(json!({"a": [true]})));
        assert_eq!(listed_value("null", &members), Some(Value::Null));
        assert_eq!(listed_value("3", &members), None);
    }

    #[test]
    fn conversion_types_keep_vllms_single_names_and_merge_lists() {
        assert_eq!(conversion_type(&["integer"]), "integer");
        assert_eq!(conversion_type(&["integer", "null"]), "integer");
        assert_eq!(conversion_type(&["integer", "string"]), "integer");
        assert_eq!(conversion_type(&["integer", "number"]), "number");
        assert_eq!(conversion_type(&["boolean", "integer"]), "object");
        assert_eq!(conversion_type(&["int", "float"]), "int");
        assert_eq!(conversion_type(&["null"]), "string");
        assert_eq!(conversion_type(&[]), "string");
    }
}
