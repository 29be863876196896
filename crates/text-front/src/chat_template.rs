//! The model's own chat template, rendered with minijinja.
//!
//! The environment mimics the one Hugging Face transformers renders chat
//! templates with (`transformers.utils.chat_template_utils`):
//!
//! * `trim_blocks` and `lstrip_blocks` on, trailing newline of the template
//!   dropped;
//! * Python string/dict methods (`startswith`, `split`, `strip`, `items`...)
//!   through minijinja-contrib's pycompat callback;
//! * `tojson` behaves like HF's: `json.dumps(x, ensure_ascii=False)` with
//!   Python's default `", "` / `": "` separators, key order kept, no HTML
//!   escaping; `indent`, `separators`, `sort_keys` and `ensure_ascii` are
//!   accepted as HF's filter accepts them (positionally only the first two,
//!   `ensure_ascii` and `indent`; the others as keyword arguments);
//! * `{{ x }}` and `x | string` write numbers, lists and dicts as Python's
//!   `str()` does (`1e-05`, `['integer', 'null']`, `{'a': True}`;
//!   [`crate::template_python`]): Qwen3-Coder's templates print tool
//!   schemas and tool-call arguments that way;
//! * `raise_exception(msg)` aborts rendering; the result is
//!   `TextFrontError::Template(msg)`;
//! * `strftime_now(fmt)` formats the current time (UTC);
//! * variables: `messages`, `tools` (only when given and non-empty),
//!   `add_generation_prompt`, `bos_token` / `eos_token` when known, and every
//!   key of the request's `chat_template_kwargs` (e.g. `enable_thinking`);
//!   kwargs cannot override the first three.
//!
//! Messages are normalised before rendering (as vLLM does; HF would instead
//! fail or print the raw structures with Qwen3's template):
//!
//! * `content` given as a list of parts (`[{"type": "text", "text": ...}]`)
//!   is flattened into one string, text parts joined with `"\n"`; other part
//!   types are rejected (the model is text-only);
//! * `content` that is `null` or missing becomes `""` (OpenAI clients send
//!   `null` for assistant messages that only carry `tool_calls`; Qwen3's
//!   template would fail on it);
//! * `tool_calls[].function.arguments` given as a JSON string that holds a
//!   JSON object is parsed into that object, so templates see a mapping.
//!   Qwen3's template then prints it with `tojson`, i.e. as
//!   `{"city": "Paris"}` — the same spacing the model itself emits — instead
//!   of copying the client's string verbatim.

use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};

use crate::tokenizer::TextTokenizer;
use crate::TextFrontError;

const TEMPLATE_NAME: &str = "chat_template";

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` once; a syntax error is `TextFrontError::Template`.
    pub fn new(source: &str) -> Result<Self, TextFrontError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| TextFrontError::Template(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", crate::template_json::tojson_filter);
        env.add_filter("string", crate::template_python::string_filter);
        env.set_formatter(crate::template_python::formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(template_error)?;
        Ok(Self { env, source: source.to_string(), bos_token: None, eos_token: None })
    }

    /// Makes `bos_token` / `eos_token` available to the template.
    pub fn with_special_tokens(mut self, bos_token: Option<String>, eos_token: Option<String>) -> Self {
        self.bos_token = bos_token;
        self.eos_token = eos_token;
        self
    }

    /// The tokenizer's chat template (None when it has none), with its BOS /
    /// EOS tokens.
    pub fn from_tokenizer(tokenizer: &TextTokenizer) -> Result<Option<Self>, TextFrontError> {
        let Some(source) = tokenizer.chat_template_source() else {
            return Ok(None);
        };
        Ok(Some(
            Self::new(source)?.with_special_tokens(tokenizer.bos_token().map(str::to_string), tokenizer.eos_token().map(str::to_string)),
        ))
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (OpenAI-shaped JSON array) with optional `tools`
    /// (OpenAI-shaped JSON array), `add_generation_prompt`, and extra
    /// template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        kwargs: &Map<String, Value>,
    ) -> Result<String, TextFrontError> {
        let messages = normalize_messages(messages)?;

        let mut ctx = JsonMap::default();
        for (k, v) in kwargs {
            ctx.insert(k, to_value(v));
        }
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token", minijinja::Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token", minijinja::Value::from(eos.as_str()));
        }
        ctx.insert("messages", to_value(&messages));
        match tools {
            Some(Value::Array(list)) if list.is_empty() => ctx.remove("tools"),
            Some(Value::Null) | None => ctx.remove("tools"),
            Some(t) => ctx.insert("tools", to_value(t)),
        }
        ctx.insert("add_generation_prompt", minijinja::Value::from(add_generation_prompt));

        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        tmpl.render(minijinja::Value::from_object(ctx)).map_err(template_error)
    }
}

// ---------------------------------------------------------------------------
// Message normalisation

fn invalid_messages(message: String) -> TextFrontError {
    TextFrontError::InvalidParam { param: "messages".to_string(), message }
}

fn normalize_messages(messages: &Value) -> Result<Value, TextFrontError> {
    let Value::Array(list) = messages else {
        return Err(invalid_messages("'messages' must be an array of message objects".to_string()));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, msg) in list.iter().enumerate() {
        let Value::Object(obj) = msg else {
            return Err(invalid_messages(format!("messages[{i}] must be an object")));
        };
        let mut obj = obj.clone();
        let content = match obj.get("content") {
            None | Some(Value::Null) => Value::String(String::new()),
            Some(Value::Array(parts)) => Value::String(flatten_parts(i, parts)?),
            Some(other) => other.clone(),
        };
        obj.insert("content".to_string(), content);
        if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
            for call in calls.iter_mut() {
                let args = call.get_mut("function").and_then(|f| f.get_mut("arguments"));
                if let Some(args) = args {
                    if let Value::String(s) = args {
                        if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                            *args = parsed;
                        }
                    }
                }
            }
        }
        out.push(Value::Object(obj));
    }
    Ok(Value::Array(out))
}

fn flatten_parts(i: usize, parts: &[Value]) -> Result<String, TextFrontError> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Value::String(s) => texts.push(s.as_str()),
            Value::Object(p) => {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("text");
                match (ty, p.get("text")) {
                    ("text", Some(Value::String(t))) => texts.push(t.as_str()),
                    ("text", _) => return Err(invalid_messages(format!("messages[{i}]: a text content part needs a string 'text'"))),
                    (other, _) => {
                        return Err(invalid_messages(format!(
                            "messages[{i}]: content parts of type '{other}' are not supported by this model (text only)"
                        )))
                    }
                }
            }
            _ => return Err(invalid_messages(format!("messages[{i}]: content parts must be objects"))),
        }
    }
    Ok(texts.join("\n"))
}

// ---------------------------------------------------------------------------
// JSON -> minijinja values, keeping key order

/// A JSON object as a minijinja map that keeps insertion order (minijinja's
/// own map type is sorted unless its `preserve_order` feature is on, and HF's
/// `tojson` prints keys in the order the request gave them).
#[derive(Debug, Default)]
struct JsonMap {
    entries: Vec<(minijinja::Value, minijinja::Value)>,
}

impl JsonMap {
    fn insert(&mut self, key: &str, value: minijinja::Value) {
        let key = minijinja::Value::from(key);
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    fn remove(&mut self, key: &str) {
        self.entries.retain(|(k, _)| k.as_str() != Some(key));
    }
}

impl Object for JsonMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.entries.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries.len())
    }
}

fn to_value(v: &Value) -> minijinja::Value {
    match v {
        Value::Null => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                minijinja::Value::from(i)
            } else if let Some(u) = n.as_u64() {
                minijinja::Value::from(u)
            } else {
                minijinja::Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => minijinja::Value::from(s.as_str()),
        Value::Array(a) => minijinja::Value::from(a.iter().map(to_value).collect::<Vec<_>>()),
        Value::Object(o) => minijinja::Value::from_object(JsonMap {
            entries: o.iter().map(|(k, v)| (minijinja::Value::from(k.as_str()), to_value(v))).collect(),
        }),
    }
}

// ---------------------------------------------------------------------------
// Errors

/// The payload of `raise_exception(msg)`, found again in the error chain.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

fn raise_exception(msg: String) -> Result<minijinja::Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedException(msg)))
}

/// `raise_exception` messages come back as they were raised; other errors
/// carry minijinja's description (with the template line).
fn template_error(e: minijinja::Error) -> TextFrontError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = src {
        if let Some(raised) = err.downcast_ref::<RaisedException>() {
            return TextFrontError::Template(raised.0.clone());
        }
        src = err.source();
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(err) = src {
        msg.push_str(": ");
        msg.push_str(&err.to_string());
        src = err.source();
    }
    TextFrontError::Template(msg)
}

// ---------------------------------------------------------------------------
// strftime_now

fn strftime_now(format: String) -> Result<minijinja::Value, minijinja::Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    Ok(minijinja::Value::from(strftime_utc(&format, secs)))
}

/// Days since 1970-01-01 -> (year, month 1..=12, day 1..=31) (H. Hinnant).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A subset of C's strftime for UTC times: %Y %y %m %d %e %H %I %M %S %p %b
/// %h %B %a %A %j %u %w %F %T %D %Z %z %% and glibc's `%-X` (no padding).
fn strftime_utc(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, (sod / 60) % 60, sod % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[month as usize - 1] + day as i64 + i64::from(is_leap && month > 2);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |v: i64, width: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month as i64, 2)),
            Some('d') => out.push_str(&num(day as i64, 2)),
            Some('e') => out.push_str(&if no_pad { day.to_string() } else { format!("{day:>2}") }),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('u') => out.push_str(&(if weekday == 0 { 7 } else { weekday }).to_string()),
            Some('w') => out.push_str(&weekday.to_string()),
            Some('F') => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            Some('T') => out.push_str(&format!("{hour:02}:{minute:02}:{second:02}")),
            Some('D') => out.push_str(&format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100))),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen3() -> ChatTemplate {
        let tok = crate::tokenizer::TextTokenizer::embedded_qwen3().unwrap();
        ChatTemplate::from_tokenizer(&tok).unwrap().expect("Qwen3 has a template")
    }

    fn render_simple(t: &ChatTemplate, messages: Value) -> Result<String, TextFrontError> {
        t.render(&messages, None, true, &Map::new())
    }

    #[test]
    fn syntax_error_is_a_template_error_at_construction() {
        assert!(matches!(ChatTemplate::new("{% if %}"), Err(TextFrontError::Template(_))));
        assert!(matches!(ChatTemplate::new("{{ x "), Err(TextFrontError::Template(_))));
    }

    #[test]
    fn raise_exception_becomes_template_error_with_its_message() {
        // The check newer Qwen3 templates (e.g. Qwen3-2507) make.
        let src = "{%- set ns = namespace(found=false) %}{%- for m in messages %}{%- if m.role == 'user' %}\
                   {%- set ns.found = true %}{%- endif %}{%- endfor %}\
                   {%- if not ns.found %}{{- raise_exception('No user query found in messages.') }}{%- endif %}ok";
        let t = ChatTemplate::new(src).unwrap();
        let err = render_simple(&t, json!([{"role": "system", "content": "s"}])).unwrap_err();
        match err {
            TextFrontError::Template(msg) => assert_eq!(msg, "No user query found in messages."),
            other => panic!("expected a template error, got {other:?}"),
        }
        assert_eq!(render_simple(&t, json!([{"role": "user", "content": "u"}])).unwrap(), "ok");
    }

    #[test]
    fn missing_user_message_is_a_template_error_not_a_panic() {
        // Qwen3's own template, with no messages at all, fails on
        // `messages[0].role` — an error, not a panic.
        let t = qwen3();
        let err = render_simple(&t, json!([])).unwrap_err();
        assert!(matches!(err, TextFrontError::Template(_)), "{err:?}");
    }

    #[test]
    fn runtime_errors_are_template_errors() {
        let t = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}").unwrap();
        let err = render_simple(&t, json!([{"role": "user", "content": "x"}])).unwrap_err();
        assert!(matches!(err, TextFrontError::Template(_)), "{err:?}");
    }

    #[test]
    fn kwargs_reach_the_template_and_cannot_override_builtins() {
        let t = qwen3();
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let mut kw = Map::new();
        kw.insert("enable_thinking".into(), json!(false));
        kw.insert("add_generation_prompt".into(), json!(false));
        let out = t.render(&msgs, None, true, &kw).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    }

    #[test]
    fn bos_and_eos_tokens_are_variables() {
        let t = ChatTemplate::new("{{ bos_token }}|{{ eos_token }}|{{ bos_token is defined }}")
            .unwrap()
            .with_special_tokens(None, Some("<|im_end|>".into()));
        assert_eq!(render_simple(&t, json!([])).unwrap(), "|<|im_end|>|False");
    }

    #[test]
    fn tools_are_only_defined_when_non_empty() {
        let t = ChatTemplate::new("{{ tools is defined }}").unwrap();
        let m = json!([]);
        // (booleans print the Python way, as in Jinja2)
        assert_eq!(t.render(&m, None, false, &Map::new()).unwrap(), "False");
        assert_eq!(t.render(&m, Some(&json!([])), false, &Map::new()).unwrap(), "False");
        assert_eq!(t.render(&m, Some(&json!([{"type": "function"}])), false, &Map::new()).unwrap(), "True");
    }

    #[test]
    fn content_parts_are_flattened_into_a_string() {
        let t = qwen3();
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]);
        let flat = json!([{"role": "user", "content": "a\nb"}]);
        assert_eq!(render_simple(&t, parts).unwrap(), render_simple(&t, flat).unwrap());
        let image = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
        assert!(matches!(render_simple(&t, image), Err(TextFrontError::InvalidParam { .. })));
    }

    #[test]
    fn null_content_and_string_arguments_render_like_hf_inputs() {
        let t = qwen3();
        let call = |args: Value, content: Value| {
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": content, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
            ])
        };
        let reference = render_simple(&t, call(json!({"city": "Paris", "days": 2}), json!(""))).unwrap();
        let openai = render_simple(&t, call(json!("{\"city\":\"Paris\",\"days\":2}"), Value::Null)).unwrap();
        assert_eq!(openai, reference);
        assert!(
            reference.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>")
        );
        // A string that is not a JSON object is passed through verbatim.
        let raw = render_simple(&t, call(json!("not json"), json!(""))).unwrap();
        assert!(raw.contains("\"arguments\": not json}"));
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}").unwrap();
        let r = |x: Value| {
            let mut kw = Map::new();
            kw.insert("x".into(), x);
            t.render(&json!([]), None, false, &kw).unwrap()
        };
        assert_eq!(r(json!({"b": 1, "a": [1, 2.5, null, true], "c": {}})), r#"{"b": 1, "a": [1, 2.5, null, true], "c": {}}"#);
        assert_eq!(r(json!("<a href='x'>&\"é🦀\"\n\u{1}</a>")), "\"<a href='x'>&\\\"é🦀\\\"\\n\\u0001</a>\"");
        assert_eq!(
            r(json!([1.0, 0.0001, 0.00001, 1e16, 1e15, -2.5e-7, 123456789.125, 1e300])),
            "[1.0, 0.0001, 1e-05, 1e+16, 1000000000000000.0, -2.5e-07, 123456789.125, 1e+300]"
        );

        let t = ChatTemplate::new("{{ x | tojson(indent=2, sort_keys=true) }}|{{ x | tojson(ensure_ascii=true, separators=[',', ':']) }}")
            .unwrap();
        let mut kw = Map::new();
        kw.insert("x".into(), json!({"z": "é🦀", "a": [1, {}]}));
        assert_eq!(
            t.render(&json!([]), None, false, &kw).unwrap(),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"z\": \"é🦀\"\n}|{\"z\":\"\\u00e9\\ud83e\\udd80\",\"a\":[1,{}]}"
        );
    }

    #[test]
    fn python_string_methods_work() {
        let t = ChatTemplate::new(
            "{{ s.startswith('ab') }} {{ s.endswith('yz') }} {{ s.split('-')[1] }} {{ ('\\n' ~ s ~ '\\n').strip('\\n') }} \
             {{ '  x '.lstrip() }}| {{ ' x  '.rstrip() }}| {{ s.upper() }}",
        )
        .unwrap();
        let mut kw = Map::new();
        kw.insert("s".into(), json!("ab-mid-yz"));
        assert_eq!(t.render(&json!([]), None, false, &kw).unwrap(), "True True mid ab-mid-yz x |  x| AB-MID-YZ");
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime_utc("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(strftime_utc("%A %B %-d, %I%p %j %%", t), "Thursday February 29, 01PM 060 %");
        assert_eq!(strftime_utc("%F %T", 0), "1970-01-01 00:00:00");
        let out = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap().render(&json!([]), None, false, &Map::new()).unwrap();
        assert!(out.len() == 4 && out.starts_with('2'), "{out}");
    }

    #[test]
    fn trailing_newline_and_block_whitespace_follow_hf() {
        let t = ChatTemplate::new("{% for m in messages %}\n    {% if m.role %}\n{{ m.role }}\n    {% endif %}\n{% endfor %}\n").unwrap();
        assert_eq!(render_simple(&t, json!([{"role": "a"}, {"role": "b"}])).unwrap(), "a\nb\n");
    }
}
