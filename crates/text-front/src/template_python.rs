//! Python's `str()` of chat-template values, as Jinja2 prints them under
//! transformers: what `{{ x }}` and `x | string` write for a number, a list
//! or a dict. Qwen3-Coder's templates print tool schemas and tool-call
//! arguments this way (`<type>['integer', 'null']</type>`,
//! `<minimum>1e-05</minimum>`, `<parameter=flag>\nTrue\n</parameter>`).
//!
//! minijinja already prints `True` / `False` / `None` and quotes strings
//! inside containers as Python's `repr` does; its floats are Rust's
//! (`0.00001`, `10000000000000000.0`) where Python writes `1e-05` and
//! `1e+16`, at the top level and inside containers. Not covered: `~`
//! concatenation converts with minijinja's own rules (a float operand of `~`
//! prints the Rust way).

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::Value;

use crate::template_json::py_float_repr;

/// Python's `str(value)`: strings as they are, the rest as `repr`.
pub(crate) fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => {
            let mut out = String::new();
            py_repr(&mut out, value);
            out
        }
    }
}

/// The `string` filter with Python's `str()` (Jinja2's `string` is
/// `str()`, an undefined value included: "").
pub(crate) fn string_filter(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        return value.clone();
    }
    Value::from(py_str(value))
}

/// Output of `{{ x }}`: Python's `str()` for numbers and containers, the
/// default for the rest (strings, booleans, none, undefined).
pub(crate) fn formatter(out: &mut minijinja::Output, state: &mut minijinja::State, value: &Value) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            out.write_str(&py_str(value)).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::WriteFailure, e.to_string()))
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

fn py_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(f) if f.is_nan() => out.push_str("nan"),
            Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "inf" } else { "-inf" }),
            Ok(f) => out.push_str(&py_float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::String => py_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                comma_separated(out, items, |out, item| py_repr(out, &item));
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                comma_separated(out, keys, |out, key| {
                    py_repr(out, &key);
                    out.push_str(": ");
                    py_repr(out, &value.get_item(&key).unwrap_or_default());
                });
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `items`, each written by `write`, with `, ` between them (a Python
/// list's or dict's repr).
fn comma_separated<T>(out: &mut String, items: impl Iterator<Item = T>, mut write: impl FnMut(&mut String, T)) {
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write(out, item);
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`;
/// backslash escapes for the quote, `\\`, `\n`, `\r`, `\t` and characters
/// Python does not print (controls and the usual invisible ones).
fn py_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let cp = c as u32;
                let _ = match cp {
                    0..=0xff => write!(out, "\\x{cp:02x}"),
                    0x100..=0xffff => write!(out, "\\u{cp:04x}"),
                    _ => write!(out, "\\U{cp:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character: not a control, format,
/// separator (other than the space) or surrogate / unassigned code point.
/// The Unicode tables are not at hand here: controls and the separators and
/// format characters text actually carries are covered.
fn py_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() {
        return false;
    }
    !matches!(
        c as u32,
        0xa0 | 0xad | 0x61c | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000 | 0xfeff
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use crate::chat_template::ChatTemplate;

    /// `x | string` and `{{ x }}` of a JSON value, through a template.
    fn s(v: serde_json::Value) -> String {
        let t = ChatTemplate::new("{{ x | string }}|{{ x }}").unwrap();
        let mut kw = Map::new();
        kw.insert("x".into(), v);
        let out = t.render(&json!([]), None, false, &kw).unwrap();
        let (filtered, printed) = out.split_once('|').unwrap();
        assert_eq!(filtered, printed, "string filter and output agree");
        filtered.to_string()
    }

    #[test]
    fn matches_python_str() {
        // Expected values are Python 3's str() of the same objects.
        assert_eq!(s(json!(1e-05)), "1e-05");
        assert_eq!(s(json!(1e16)), "1e+16");
        assert_eq!(s(json!(60.0)), "60.0");
        assert_eq!(s(json!(30.5)), "30.5");
        assert_eq!(s(json!(-7)), "-7");
        assert_eq!(s(json!(true)), "True");
        assert_eq!(s(json!(null)), "None");
        assert_eq!(s(json!("it's")), "it's");
        assert_eq!(s(json!(["integer", "null"])), "['integer', 'null']");
        assert_eq!(s(json!([0.5, 1, true, null, "x", 1e-07])), "[0.5, 1, True, None, 'x', 1e-07]");
        assert_eq!(s(json!({"a": [1, {"b": false}], "c": 2.0})), "{'a': [1, {'b': False}], 'c': 2.0}");
        assert_eq!(
            s(json!(["it's", "say \"hi\"", "both ' \"", "tab\there\n", "nbsp\u{a0}é"])),
            r#"["it's", 'say "hi"', 'both \' "', 'tab\there\n', 'nbsp\xa0é']"#
        );
    }
}
