//! The chat template's `tojson` filter, as Hugging Face defines it:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)` — Python's `", "` / `": "` separators, key order kept,
//! no HTML escaping, Python's float formatting.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::ErrorKind;

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

pub(crate) fn tojson_filter(
    value: &minijinja::Value,
    ensure_ascii: Option<bool>,
    indent: Option<minijinja::Value>,
    kwargs: Kwargs,
) -> Result<minijinja::Value, minijinja::Error> {
    let ensure_ascii = match kwargs.get::<Option<bool>>("ensure_ascii")? {
        Some(b) => b,
        None => ensure_ascii.unwrap_or(false),
    };
    let indent = kwargs.get::<Option<minijinja::Value>>("indent")?.or(indent);
    let separators = kwargs.get::<Option<minijinja::Value>>("separators")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = i64::try_from(v)
                    .map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string"))?;
                Some(" ".repeat(n.max(0) as usize))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !(v.is_none() || v.is_undefined()) => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .filter(|p| p.len() == 2)
                .ok_or_else(|| minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"))?;
            (parts[0].clone(), parts[1].clone())
        }
        // Python: (', ', ': ') without indent, (',', ': ') with it.
        _ => (if indent.is_some() { ",".to_string() } else { ", ".to_string() }, ": ".to_string()),
    };
    let style = JsonStyle { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(minijinja::Value::from(out))
}

fn not_serializable(value: &minijinja::Value) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: object of type {} is not JSON serializable", value.kind()))
}

fn write_newline_indent(out: &mut String, style: &JsonStyle, level: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, value: &minijinja::Value, style: &JsonStyle, level: usize) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                let f = f64::try_from(value.clone()).map_err(|_| not_serializable(value))?;
                out.push_str(&py_float_repr(f));
            }
        }
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<minijinja::Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                write_newline_indent(out, style, level + 1);
                write_json(out, item, style, level + 1)?;
            }
            write_newline_indent(out, style, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, minijinja::Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::None => "null".to_string(),
                    ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
                    ValueKind::Number if key.is_integer() => key.to_string(),
                    ValueKind::Number => py_float_repr(f64::try_from(key.clone()).map_err(|_| not_serializable(&key))?),
                    _ => {
                        return Err(minijinja::Error::new(
                            ErrorKind::InvalidOperation,
                            format!("tojson: keys must be str, int, float, bool or None, not {}", key.kind()),
                        ))
                    }
                };
                pairs.push((key, item));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                write_newline_indent(out, style, level + 1);
                write_json_str(out, k, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, v, style, level + 1)?;
            }
            write_newline_indent(out, style, level);
            out.push('}');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A JSON string literal as Python's `json.dumps` writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{:04x}", unit);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (what `json.dumps` prints for floats): shortest
/// round-trip digits, exponent form below 1e-4 and from 1e16 on.
pub(crate) fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let sci = format!("{f:e}"); // e.g. "-1.5e-7", "1e20", "0e0"
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("LowerExp exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let point = exp as usize + 1;
            let (int_part, frac_part) = if digits.len() > point {
                (digits[..point].to_string(), digits[point..].to_string())
            } else {
                (format!("{digits}{}", "0".repeat(point - digits.len())), "0".to_string())
            };
            format!("{sign}{int_part}.{frac_part}")
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}
