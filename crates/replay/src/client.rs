//! One streaming OpenAI request, timed: `POST /v1/completions` (token-id
//! prompt) or `/v1/chat/completions` (messages), `stream: true` with
//! `stream_options.include_usage`, the session id as body field and
//! header. kvc's extensions (`x-kvc-path` header, `kvc` object in the
//! final chunk) are read when present and never required.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::timeout_at;

use crate::http::{self, BaseUrl};
use crate::sse::SseParser;
use crate::synth::prompt::Prompt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    Completions,
    Chat,
}

crate::named::from_str_by_serde_name!(Api, "api", "completions, chat");

pub const SESSION_HEADER: &str = "x-session-id";

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: BaseUrl,
    pub api: Api,
    /// The `model` field; `None` leaves it out.
    pub model: Option<String>,
    pub api_key: Option<String>,
    /// Also send the session id as body field `session_id` (kvc, SGLang);
    /// the `x-session-id` header always goes.
    pub session_field: bool,
    /// Send `ignore_eos: true` so outputs have the trace's length.
    pub ignore_eos: bool,
}

/// How a kvc server says it served a request (its `kvc` body field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvcInfo {
    pub path: Option<String>,
    pub reason: Option<String>,
    pub cached_tokens: Option<u64>,
    pub computed_tokens: Option<u64>,
    pub transferred_tokens: Option<u64>,
}

/// What happened to one request. Times are seconds from sending it.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub status: Option<u16>,
    pub ttft_s: Option<f64>,
    /// Arrival of each chunk that carried output.
    pub token_times_s: Vec<f64>,
    pub latency_s: f64,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    pub kvc: Option<KvcInfo>,
    pub path_header: Option<String>,
    pub finish_reason: Option<String>,
    pub text: String,
    pub error: Option<String>,
    /// Cancelled by a stop of the run (signal, `--duration-s`) before it
    /// ended: not the server's failure. What had arrived is kept.
    pub cut: bool,
}

impl Endpoint {
    fn headers(&self, session: Option<&str>) -> Vec<(&'static str, String)> {
        let mut h = vec![("content-type", "application/json".to_string()), ("accept", "text/event-stream".to_string())];
        if let Some(k) = &self.api_key {
            h.push(("authorization", format!("Bearer {k}")));
        }
        if let Some(s) = session {
            h.push((SESSION_HEADER, s.to_string()));
        }
        h
    }

    /// The request body.
    pub fn body(&self, prompt: &Prompt, max_tokens: usize, session: Option<&str>) -> Value {
        let mut b = json!({
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        match self.api {
            Api::Completions => b["prompt"] = json!(prompt.tokens),
            Api::Chat => b["messages"] = json!(prompt.messages),
        }
        if let Some(m) = &self.model {
            b["model"] = json!(m);
        }
        if self.ignore_eos {
            b["ignore_eos"] = json!(true);
        }
        if let (true, Some(s)) = (self.session_field, session) {
            b["session_id"] = json!(s);
        }
        b
    }

    fn path(&self) -> &'static str {
        match self.api {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        }
    }

    /// Sends one streaming request and reads it to the end or `deadline`.
    /// Never fails: errors are in [`Outcome::error`].
    pub async fn stream(&self, prompt: &Prompt, max_tokens: usize, session: Option<&str>, deadline: tokio::time::Instant) -> Outcome {
        self.stream_until(prompt, max_tokens, session, deadline, std::future::pending()).await
    }

    /// [`Endpoint::stream`], cut short when `stop` resolves first: then the
    /// outcome is [`Outcome::cut`], with what had arrived until then.
    pub async fn stream_until(
        &self,
        prompt: &Prompt,
        max_tokens: usize,
        session: Option<&str>,
        deadline: tokio::time::Instant,
        stop: impl std::future::Future<Output = ()>,
    ) -> Outcome {
        let t0 = Instant::now();
        let mut out = Outcome::default();
        let finished = tokio::select! {
            biased;
            _ = stop => None,
            r = self.stream_into(&mut out, t0, prompt, max_tokens, session, deadline) => Some(r),
        };
        match finished {
            Some(Err(e)) => out.error = Some(e),
            Some(Ok(())) => {}
            None => out.cut = true,
        }
        out.latency_s = t0.elapsed().as_secs_f64();
        out
    }

    async fn stream_into(
        &self,
        out: &mut Outcome,
        t0: Instant,
        prompt: &Prompt,
        max_tokens: usize,
        session: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Result<(), String> {
        let body = serde_json::to_vec(&self.body(prompt, max_tokens, session)).map_err(|e| e.to_string())?;
        let timed_out = || format!("timed out after {:.1}s", t0.elapsed().as_secs_f64());
        let headers = self.headers(session);
        let sent = http::send(&self.url, "POST", self.path(), &headers, Some(&body));
        let mut resp = timeout_at(deadline, sent).await.map_err(|_| timed_out())?.map_err(|e| e.to_string())?;
        out.status = Some(resp.status);
        out.path_header = resp.header("x-kvc-path").map(str::to_string);
        if resp.status != 200 {
            let status = resp.status;
            let bytes = timeout_at(deadline, resp.bytes()).await.map_err(|_| timed_out())?.unwrap_or_default();
            return Err(format!("HTTP {status}: {}", error_message(&bytes)));
        }
        let mut sse = SseParser::default();
        let mut done = false;
        loop {
            let piece = timeout_at(deadline, resp.chunk()).await.map_err(|_| timed_out())?.map_err(|e| e.to_string())?;
            let now = t0.elapsed().as_secs_f64();
            let events = match &piece {
                Some(bytes) => sse.push(bytes),
                None => sse.finish().into_iter().collect(),
            };
            for data in events {
                if data.trim() == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(&data).map_err(|e| format!("bad stream chunk ({e}): {data:.200}"))?;
                self.read_chunk(out, &v, now)?;
            }
            if piece.is_none() {
                break;
            }
        }
        if out.ttft_s.is_none() && out.finish_reason.is_some() {
            // No chunk carried text (every token decoded to nothing): the
            // first answer the client saw was the finish.
            out.ttft_s = out.token_times_s.first().copied();
        }
        if out.finish_reason.is_none() {
            return Err(if done { "stream ended without a finish_reason".into() } else { "stream ended early".into() });
        }
        Ok(())
    }

    fn read_chunk(&self, out: &mut Outcome, v: &Value, now: f64) -> Result<(), String> {
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            return Err(format!("error event: {}", e.get("message").and_then(Value::as_str).unwrap_or(&e.to_string())));
        }
        let mut content = false;
        let mut finished = false;
        for c in v.get("choices").and_then(Value::as_array).into_iter().flatten() {
            let piece = match self.api {
                Api::Completions => c.get("text").and_then(Value::as_str),
                Api::Chat => {
                    let d = c.get("delta");
                    let field = |k: &str| d.and_then(|d| d.get(k)).and_then(Value::as_str).filter(|s| !s.is_empty());
                    if d.and_then(|d| d.get("tool_calls")).is_some_and(|t| !t.is_null()) {
                        content = true;
                    }
                    field("content").or(field("reasoning_content")).or(field("reasoning"))
                }
            };
            if let Some(p) = piece.filter(|p| !p.is_empty()) {
                out.text.push_str(p);
                content = true;
            }
            if let Some(r) = c.get("finish_reason").and_then(Value::as_str) {
                out.finish_reason = Some(r.to_string());
                finished = true;
            }
        }
        if content {
            out.ttft_s.get_or_insert(now);
        }
        if content || (finished && out.token_times_s.is_empty()) {
            out.token_times_s.push(now);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            out.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64).or(out.prompt_tokens);
            out.completion_tokens = u.get("completion_tokens").and_then(Value::as_u64).or(out.completion_tokens);
            let cached = u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64);
            out.cached_tokens = cached.or(out.cached_tokens);
        }
        if let Some(k) = v.get("kvc").filter(|k| k.is_object()) {
            out.kvc = serde_json::from_value(k.clone()).ok();
        }
        Ok(())
    }
}

/// The message of an OpenAI error body, or the body itself.
fn error_message(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| text.chars().take(300).collect())
}

/// The first model id `GET /v1/models` lists, if the server has that route.
pub async fn first_model(url: &BaseUrl, api_key: Option<&str>) -> Option<String> {
    let headers: Vec<(&str, String)> = api_key.map(|k| ("authorization", format!("Bearer {k}"))).into_iter().collect();
    let (status, body) = http::get(url, "/v1/models", &headers).await.ok()?;
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_slice(&body).ok()?;
    v.pointer("/data/0/id").and_then(Value::as_str).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(api: Api) -> Endpoint {
        Endpoint {
            url: "http://127.0.0.1:1".parse().unwrap(),
            api,
            model: Some("m".into()),
            api_key: None,
            session_field: true,
            ignore_eos: true,
        }
    }

    #[test]
    fn completions_body_carries_token_ids_session_and_usage_request() {
        let p = Prompt { tokens: vec![11, 12], messages: vec![] };
        let b = endpoint(Api::Completions).body(&p, 7, Some("s-1"));
        assert_eq!(b["prompt"], json!([11, 12]));
        assert_eq!((b["max_tokens"].clone(), b["session_id"].clone()), (json!(7), json!("s-1")));
        assert_eq!(b["stream_options"]["include_usage"], json!(true));
        assert_eq!(b["ignore_eos"], json!(true));
        let mut plain = endpoint(Api::Completions);
        plain.session_field = false;
        plain.ignore_eos = false;
        plain.model = None;
        let b = plain.body(&p, 7, Some("s-1"));
        assert!(b.get("session_id").is_none() && b.get("ignore_eos").is_none() && b.get("model").is_none());
    }

    #[test]
    fn chunks_yield_text_usage_and_kvc_info() {
        let e = endpoint(Api::Chat);
        let mut o = Outcome::default();
        e.read_chunk(&mut o, &json!({"choices": [{"delta": {"role": "assistant"}, "finish_reason": null}]}), 0.1).unwrap();
        assert_eq!(o.ttft_s, None, "a role-only delta is not a token");
        e.read_chunk(&mut o, &json!({"choices": [{"delta": {"content": "hi"}, "finish_reason": null}]}), 0.2).unwrap();
        e.read_chunk(
            &mut o,
            &json!({"choices": [{"delta": {}, "finish_reason": "length"}],
            "kvc": {"path": "local", "reason": "session_hit", "cached_tokens": 32, "computed_tokens": 5, "transferred_tokens": 0}}),
            0.3,
        )
        .unwrap();
        e.read_chunk(
            &mut o,
            &json!({"choices": [], "usage": {"prompt_tokens": 37, "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 32}}}),
            0.3,
        )
        .unwrap();
        assert_eq!(o.ttft_s, Some(0.2));
        assert_eq!(o.token_times_s, vec![0.2]);
        assert_eq!((o.prompt_tokens, o.completion_tokens, o.cached_tokens), (Some(37), Some(2), Some(32)));
        assert_eq!(o.kvc.unwrap().reason.as_deref(), Some("session_hit"));
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
        let err = e.read_chunk(&mut Outcome::default(), &json!({"error": {"message": "boom"}}), 0.0).unwrap_err();
        assert!(err.contains("boom"));
    }

    #[test]
    fn openai_error_bodies_give_their_message() {
        assert_eq!(error_message(br#"{"error": {"message": "too long", "type": "x"}}"#), "too long");
        assert_eq!(error_message(b"plain"), "plain");
    }
}
