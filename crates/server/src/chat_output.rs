//! A chat answer, token by token: reasoning is split off first
//! ([`ReasoningParser`]), then tool calls are taken out of the content
//! ([`ToolParser`], Hermes or Qwen3-Coder); the pieces become `chat.completion.chunk` deltas,
//! and a whole answer is the fold of the same deltas.

use std::sync::Arc;

use kvc_engine::{FinishReason, Logprobs, MatchedStop, Usage};

use crate::endpoint::Endpoint;
use crate::logprobs::{chat_entry, ChatLogprobs, ChatTokenLogprob, HasTokenizer};
use crate::openai_types::{
    AnswerHead, AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatDelta, FunctionCall, FunctionCallDelta, KvcInfo,
    ToolCall, ToolCallDelta,
};
use crate::reasoning_parser::ReasoningParser;
use crate::tool_call_text::{ParsedToolCall, ToolOutput};
use crate::tool_parser::ToolParser;

/// What a piece of the answer turned out to be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ParsedToolCall>,
}

impl Parsed {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }

    fn append(&mut self, other: Parsed) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.calls.extend(other.calls);
    }
}

/// Reasoning first, then tool calls on the content.
#[derive(Debug, Clone)]
pub struct ChatParser {
    reasoning: ReasoningParser,
    tools: Option<ToolParser>,
}

impl ChatParser {
    /// A parser positioned after `prefix` (the assistant turn already in
    /// the prompt), taking tool calls out with `tools` (none: they stay
    /// text); also returns what `prefix` parsed to.
    pub fn primed(prefix: &str, tools: Option<ToolParser>) -> (Self, Parsed) {
        let mut p = Self { reasoning: ReasoningParser::new(), tools };
        let parsed = p.push(prefix);
        (p, parsed)
    }

    pub fn push(&mut self, text: &str) -> Parsed {
        let split = self.reasoning.push(text);
        self.tools_on(split.reasoning, &split.content, false)
    }

    pub fn finish(&mut self) -> Parsed {
        let split = self.reasoning.finish();
        self.tools_on(split.reasoning, &split.content, true)
    }

    fn tools_on(&mut self, reasoning: String, content: &str, end: bool) -> Parsed {
        let mut out = Parsed { reasoning, ..Parsed::default() };
        let Some(tools) = &mut self.tools else {
            out.content = content.to_string();
            return out;
        };
        let mut outputs = tools.push(content);
        if end {
            outputs.extend(tools.finish());
        }
        for o in outputs {
            match o {
                ToolOutput::Text(t) => out.content.push_str(&t),
                ToolOutput::Call(c) => out.calls.push(c),
            }
        }
        out
    }
}

/// `call_` + 24 random hex digits, like OpenAI's ids.
fn new_call_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", &hex[..24])
}

struct ChoiceState {
    parser: ChatParser,
    /// What the continued final message parsed to (sent with `echo`).
    echo: Option<Parsed>,
    pending_logprobs: Vec<ChatTokenLogprob>,
    calls: usize,
}

/// What shapes a chat answer.
#[derive(Debug, Clone)]
pub struct ChatSpec {
    pub id: String,
    pub model: String,
    /// The engine's `system_fingerprint` (build, model, device).
    pub system_fingerprint: String,
    /// Choices.
    pub n: usize,
    /// The open assistant turn at the end of the prompt (parsers start there).
    pub prefix: String,
    /// Parse tool-call blocks into `tool_calls` with this parser (each
    /// choice gets a fresh copy); it already knows the format and
    /// `parallel_tool_calls` ([`ToolParser::new`]). None: calls stay text.
    pub tools: Option<ToolParser>,
    /// An answer with calls finishes with "tool_calls" (false for a named
    /// `tool_choice`, whose forced call finishes with "stop", as OpenAI's).
    pub calls_finish: bool,
    /// Return what `prefix` parsed to as part of the answer.
    pub echo: bool,
    pub logprobs: bool,
}

/// The chat endpoint's deltas for `n` choices.
pub struct ChatEndpoint {
    /// Its chunks' head (the body's is `chat.completion`).
    head: AnswerHead,
    tokens: Arc<dyn HasTokenizer>,
    logprobs: bool,
    choices: Vec<ChoiceState>,
    calls_finish: bool,
}

impl ChatEndpoint {
    pub fn new(spec: ChatSpec, tokens: Arc<dyn HasTokenizer>) -> Self {
        let ChatSpec { id, model, system_fingerprint, n, prefix, tools, calls_finish, echo, logprobs } = spec;
        let prefix = prefix.as_str();
        let choices = (0..n)
            .map(|_| {
                let (parser, echoed) = ChatParser::primed(prefix, tools.clone());
                ChoiceState { parser, echo: echo.then_some(echoed), pending_logprobs: Vec::new(), calls: 0 }
            })
            .collect();
        let head = AnswerHead { id, object: "chat.completion.chunk", created: crate::generate::unix_now(), model, system_fingerprint };
        Self { head, tokens, logprobs, choices, calls_finish }
    }

    fn delta(&mut self, index: usize, parsed: Parsed) -> ChatDelta {
        let choice = &mut self.choices[index];
        let tool_calls: Vec<ToolCallDelta> = parsed
            .calls
            .into_iter()
            .map(|c| {
                choice.calls += 1;
                ToolCallDelta {
                    index: choice.calls - 1,
                    id: new_call_id(),
                    kind: "function",
                    function: FunctionCallDelta { name: c.name, arguments: c.arguments },
                }
            })
            .collect();
        let some = |s: String| (!s.is_empty()).then_some(s);
        ChatDelta {
            role: None,
            content: some(parsed.content),
            reasoning_content: some(parsed.reasoning),
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        }
    }

    fn take_logprobs(&mut self, index: usize) -> Option<ChatLogprobs> {
        let pending = std::mem::take(&mut self.choices[index].pending_logprobs);
        (self.logprobs && !pending.is_empty()).then_some(ChatLogprobs { content: pending })
    }

    fn choice(index: usize, delta: ChatDelta, logprobs: Option<ChatLogprobs>) -> ChatChunkChoice {
        ChatChunkChoice { index, delta, logprobs, finish_reason: None, stop_reason: None }
    }
}

impl Endpoint for ChatEndpoint {
    type Delta = ChatChunkChoice;
    type Body = ChatCompletion;

    fn start(&mut self, index: usize) -> Vec<ChatChunkChoice> {
        let role = ChatDelta { role: Some("assistant"), content: Some(String::new()), ..ChatDelta::default() };
        let mut out = vec![Self::choice(index, role, None)];
        if let Some(echoed) = self.choices[index].echo.take().filter(|p| !p.is_empty()) {
            let delta = self.delta(index, echoed);
            out.push(Self::choice(index, delta, None));
        }
        out
    }

    fn token(&mut self, index: usize, _token_id: u32, text: &str, logprobs: Option<&Logprobs>) -> Option<ChatChunkChoice> {
        if let (true, Some(lp)) = (self.logprobs, logprobs) {
            let entry = chat_entry(self.tokens.tokenizer(), lp);
            self.choices[index].pending_logprobs.push(entry);
        }
        let parsed = self.choices[index].parser.push(text);
        if parsed.is_empty() {
            return None;
        }
        let delta = self.delta(index, parsed);
        Some(Self::choice(index, delta, self.take_logprobs(index)))
    }

    fn finish(
        &mut self,
        index: usize,
        text: &str,
        reason: FinishReason,
        stop: Option<MatchedStop>,
    ) -> (Vec<ChatChunkChoice>, &'static str) {
        let parser = &mut self.choices[index].parser;
        let mut parsed = parser.push(text);
        parsed.append(parser.finish());
        let mut out = Vec::new();
        if !parsed.is_empty() {
            let delta = self.delta(index, parsed);
            out.push(Self::choice(index, delta, self.take_logprobs(index)));
        }
        let calls = self.calls_finish && self.choices[index].calls > 0;
        let reported = if calls && reason != FinishReason::Abort { "tool_calls" } else { reason.as_str() };
        let mut last = Self::choice(index, ChatDelta::default(), self.take_logprobs(index));
        last.finish_reason = Some(reported);
        last.stop_reason = stop;
        out.push(last);
        (out, reported)
    }

    fn head(&self) -> &AnswerHead {
        &self.head
    }

    fn body(&self, choices: Vec<Vec<ChatChunkChoice>>, usage: Usage) -> ChatCompletion {
        let choices = choices.into_iter().enumerate().map(|(index, deltas)| self.fold(index, deltas)).collect();
        ChatCompletion { head: self.head.of("chat.completion"), choices, usage: usage.into(), kvc: KvcInfo::local(&usage) }
    }
}

impl ChatEndpoint {
    /// One choice's deltas as a whole message.
    fn fold(&self, index: usize, deltas: Vec<ChatChunkChoice>) -> ChatChoice {
        let (mut content, mut reasoning, mut tool_calls, mut logprobs) = (String::new(), String::new(), Vec::new(), Vec::new());
        let (mut finish_reason, mut stop_reason) = ("stop", None);
        for d in deltas {
            content.push_str(d.delta.content.as_deref().unwrap_or_default());
            reasoning.push_str(d.delta.reasoning_content.as_deref().unwrap_or_default());
            tool_calls.extend(d.delta.tool_calls.unwrap_or_default().into_iter().map(|c| ToolCall {
                id: Some(c.id),
                kind: c.kind.to_string(),
                function: FunctionCall { name: c.function.name, arguments: c.function.arguments.into() },
            }));
            logprobs.extend(d.logprobs.map(|l| l.content).unwrap_or_default());
            if let Some(f) = d.finish_reason {
                (finish_reason, stop_reason) = (f, d.stop_reason);
            }
        }
        // OpenAI: content is null when the answer is only tool calls (or,
        // here, only reasoning).
        let content = if content.is_empty() && (!tool_calls.is_empty() || !reasoning.is_empty()) { None } else { Some(content) };
        ChatChoice {
            index,
            message: AssistantMessage {
                role: "assistant",
                content,
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls,
            },
            logprobs: self.logprobs.then_some(ChatLogprobs { content: logprobs }),
            finish_reason,
            stop_reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_parser::ToolCallFormat;
    use kvc_engine::TokenLogprob;
    use kvc_text_front::detokenizer::IncrementalDecoder;
    use kvc_text_front::tokenizer::TextTokenizer;
    use serde_json::{json, Value};
    use std::sync::OnceLock;

    fn qwen3() -> Arc<TextTokenizer> {
        static T: OnceLock<Arc<TextTokenizer>> = OnceLock::new();
        T.get_or_init(|| Arc::new(TextTokenizer::embedded_qwen3().expect("embedded tokenizer"))).clone()
    }

    fn spec(prefix: &str, tools: bool, echo: bool, logprobs: bool) -> ChatSpec {
        ChatSpec {
            id: "chatcmpl-t".into(),
            model: "m".into(),
            system_fingerprint: "fp_t".into(),
            n: 1,
            prefix: prefix.into(),
            tools: tools.then(|| ToolParser::new(ToolCallFormat::Hermes, &[], true)),
            calls_finish: true,
            echo,
            logprobs,
        }
    }

    /// Plays `answer` as the engine would: tokenized with the real Qwen3
    /// tokenizer, detokenized incrementally, one event per token (each with
    /// logprobs), then `Finished`. Returns the streamed chunk choices and
    /// the whole-answer body built from a second, identical run.
    fn play(answer: &str, s: ChatSpec, reason: FinishReason) -> (Vec<ChatChunkChoice>, Value) {
        let tok = qwen3();
        let ids = tok.encode(answer, false).unwrap();
        let run = |endpoint: &mut ChatEndpoint| {
            let mut deltas = endpoint.start(0);
            let mut decoder = IncrementalDecoder::new(true);
            for i in 0..ids.len() {
                let text = decoder.step(&tok, &ids[..=i]);
                let lp = Logprobs { chosen: TokenLogprob { token_id: ids[i], logprob: -0.25 }, top: vec![] };
                deltas.extend(endpoint.token(0, ids[i], &text, Some(&lp)));
            }
            let tail = decoder.flush(&tok, &ids);
            deltas.extend(endpoint.finish(0, &tail, reason, None).0);
            deltas
        };
        let mut streaming = ChatEndpoint::new(s.clone(), tok.clone());
        let streamed = run(&mut streaming);
        let mut whole = ChatEndpoint::new(s, tok.clone());
        let folded = run(&mut whole);
        let usage = Usage { prompt_tokens: 5, completion_tokens: ids.len(), ..Default::default() };
        (streamed, serde_json::to_value(whole.body(vec![folded], usage)).unwrap())
    }

    fn concat(deltas: &[ChatChunkChoice], field: fn(&ChatDelta) -> Option<&String>) -> String {
        deltas.iter().filter_map(|d| field(&d.delta)).map(String::as_str).collect()
    }

    const THINK_THEN_CALL: &str = "<think>\nThe user wants the weather in Paris; I should call the tool.\n</think>\n\n\
        <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";

    #[test]
    fn qwen3_reasoning_and_tool_call_stream_as_openai_deltas() {
        let (deltas, body) = play(THINK_THEN_CALL, spec("", true, false, true), FinishReason::Stop);
        assert_eq!(concat(&deltas, |d| d.reasoning_content.as_ref()), "The user wants the weather in Paris; I should call the tool.");
        assert_eq!(concat(&deltas, |d| d.content.as_ref()), "", "no content beyond the role chunk's empty string");
        let calls: Vec<&ToolCallDelta> = deltas.iter().flat_map(|d| d.delta.tool_calls.iter().flatten()).collect();
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].index, calls[0].kind, calls[0].function.name.as_str()), (0, "function", "get_weather"));
        assert_eq!(serde_json::from_str::<Value>(&calls[0].function.arguments).unwrap(), json!({"city": "Paris", "unit": "celsius"}));
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
        let last = deltas.last().unwrap();
        assert_eq!(last.finish_reason, Some("tool_calls"));
        // Every token's logprob was sent exactly once.
        let n_logprobs: usize = deltas.iter().map(|d| d.logprobs.as_ref().map_or(0, |l| l.content.len())).sum();
        assert_eq!(n_logprobs, qwen3().encode(THINK_THEN_CALL, false).unwrap().len());

        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert!(choice["message"]["content"].is_null());
        assert_eq!(choice["message"]["reasoning_content"], "The user wants the weather in Paris; I should call the tool.");
        assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(choice["message"]["tool_calls"][0]["type"], "function");
        assert_eq!(choice["logprobs"]["content"].as_array().unwrap().len(), n_logprobs);
    }

    #[test]
    fn plain_answer_with_tools_offered_stays_content() {
        let answer = "<think>\n\n</think>\n\nIt is sunny in Paris today.";
        let (deltas, body) = play(answer, spec("", true, false, false), FinishReason::Stop);
        assert_eq!(concat(&deltas, |d| d.content.as_ref()), "It is sunny in Paris today.");
        assert!(deltas.iter().all(|d| d.logprobs.is_none()));
        assert_eq!(body["choices"][0]["message"]["content"], "It is sunny in Paris today.");
        assert!(body["choices"][0]["message"].get("tool_calls").is_none());
        assert!(body["choices"][0]["message"].get("reasoning_content").is_none());
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert!(body["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn malformed_tool_json_comes_back_as_content_with_finish_stop() {
        let answer = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {city: Paris}}\n</tool_call>";
        let (deltas, body) = play(answer, spec("<think>\n\n</think>\n\n", true, false, false), FinishReason::Stop);
        assert_eq!(concat(&deltas, |d| d.content.as_ref()), answer);
        assert_eq!(body["choices"][0]["message"]["content"], answer);
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn tool_choice_none_leaves_blocks_as_text() {
        let (deltas, body) = play(THINK_THEN_CALL, spec("", false, false, false), FinishReason::Stop);
        assert!(concat(&deltas, |d| d.content.as_ref()).starts_with("<tool_call>"));
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert!(body["choices"][0]["message"]["reasoning_content"].as_str().unwrap().starts_with("The user wants"));
    }

    #[test]
    fn thinking_disabled_prompt_yields_no_reasoning() {
        let (deltas, body) = play("Hello there.", spec("<think>\n\n</think>\n\n", false, false, false), FinishReason::Length);
        assert_eq!(concat(&deltas, |d| d.reasoning_content.as_ref()), "");
        assert_eq!(body["choices"][0]["message"]["content"], "Hello there.");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn continued_message_primes_the_parsers_and_echo_returns_it() {
        // The client prefilled the start of a tool call; the model finishes it.
        let prefix = "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", ";
        let rest = "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (_, body) = play(rest, spec(prefix, true, false, false), FinishReason::Stop);
        let message = &body["choices"][0]["message"];
        assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
        assert!(message.get("reasoning_content").is_none(), "the prefix is not echoed without echo: {message}");
        let (deltas, body) = play(rest, spec(prefix, true, true, false), FinishReason::Stop);
        assert_eq!(concat(&deltas, |d| d.reasoning_content.as_ref()), "plan");
        assert_eq!(body["choices"][0]["message"]["reasoning_content"], "plan");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn stream_and_whole_answer_agree_on_mixed_text_and_calls() {
        let answer = "<think>\nTwo tools.\n</think>\n\nChecking both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\
                      <tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>";
        let (deltas, body) = play(answer, spec("", true, false, false), FinishReason::Stop);
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], concat(&deltas, |d| d.content.as_ref()));
        assert_eq!(message["content"], "Checking both.");
        assert_eq!(message["reasoning_content"], concat(&deltas, |d| d.reasoning_content.as_ref()));
        let names: Vec<&str> = message["tool_calls"].as_array().unwrap().iter().map(|c| c["function"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["a", "b"]);
        let indexes: Vec<usize> = deltas.iter().flat_map(|d| d.delta.tool_calls.iter().flatten()).map(|c| c.index).collect();
        assert_eq!(indexes, vec![0, 1]);
        assert_eq!(message["tool_calls"][1]["function"]["arguments"], r#"{"x":[1,2]}"#);
    }

    #[test]
    fn without_parallel_tool_calls_stream_and_whole_answer_keep_the_first_call() {
        let answer = "Checking both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\
                      <tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>";
        let single = ChatSpec {
            tools: Some(ToolParser::new(ToolCallFormat::Hermes, &[], false)),
            ..spec("<think>\n\n</think>\n\n", true, false, false)
        };
        let (deltas, body) = play(answer, single, FinishReason::Stop);
        let streamed: Vec<(usize, &str)> =
            deltas.iter().flat_map(|d| d.delta.tool_calls.iter().flatten()).map(|c| (c.index, c.function.name.as_str())).collect();
        assert_eq!(streamed, vec![(0, "a")]);
        let message = &body["choices"][0]["message"];
        let names: Vec<&str> = message["tool_calls"].as_array().unwrap().iter().map(|c| c["function"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["a"]);
        assert_eq!(message["content"], "Checking both.");
        assert_eq!(concat(&deltas, |d| d.content.as_ref()), "Checking both.");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    }
}
