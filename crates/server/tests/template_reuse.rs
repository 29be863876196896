//! Session KV across a 10-turn tool-using conversation under each chat
//! template the Qwen3 agent checkpoints ship (issue 34, item 4).
//!
//! Each turn is what the server does with a client that sends the whole
//! conversation every time: the messages go through `template_messages` and
//! the checkpoint's template; the model's answer is the text its own template
//! renders for the assistant message it means (a model answers in the
//! format it was trained on), cut before `<|im_end|>` (the last sampled
//! token, whose KV a session never holds); kvc's answer parsers turn it into
//! the message the response returns, and the client appends that message
//! (with or without `reasoning_content`) and the tool results. The engine
//! runs each turn on the embedded model in one session and reports the
//! reused tokens.
//!
//! Checked: kvc reuses exactly the whole blocks of the longest common prefix
//! of the previous turn's prompt + answer and this turn's prompt (the
//! independent reference is the token comparison itself); which templates
//! extend every earlier turn as it was sent, and where the Thinking template
//! re-renders history. `KVC_TEMPLATE_REUSE_REPORT=path` writes the per-turn
//! table (docs/benchmarks.md, "Session reuse with the checkpoints' chat
//! templates").

use std::path::PathBuf;

use kvc_engine::{EngineConfig, EngineHandle, GenerateRequest, SamplingParams, StreamEvent};
use kvc_server::chat_messages::{open_assistant_turn, template_messages};
use kvc_server::chat_output::ChatParser;
use kvc_server::openai_types::ChatMessage;
use kvc_server::tool_parser::{ToolCallFormat, ToolParser};
use kvc_text_front::chat_template::ChatTemplate;
use kvc_text_front::tokenizer::TextTokenizer;
use serde_json::{json, Map, Value};

const BS: usize = 16;

fn template(file: &str) -> (ChatTemplate, ToolCallFormat) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../text-front/tests/fixtures/templates").join(file);
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (ChatTemplate::new(&source).expect("template compiles"), ToolCallFormat::of_template(Some(&source)))
}

fn tools() -> Vec<Value> {
    let f = |name: &str, desc: &str, props: Value, required: Value| {
        json!({"type": "function", "function": {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required}}})
    };
    vec![
        f(
            "read_file",
            "Read a file of the repository.",
            json!({"path": {"type": "string"}, "start_line": {"type": "integer", "default": 1}}),
            json!(["path"]),
        ),
        f(
            "edit_file",
            "Replace text in a file.",
            json!({"path": {"type": "string"}, "edits": {"type": "array", "items": {"type": "object",
                "properties": {"old": {"type": "string"}, "new": {"type": "string"}}, "required": ["old", "new"]}}}),
            json!(["path", "edits"]),
        ),
        f(
            "run_shell",
            "Run a shell command in the sandbox.",
            json!({"command": {"type": "string"}, "timeout_s": {"type": "number", "default": 60}}),
            json!(["command"]),
        ),
    ]
}

fn call(name: &str, args: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

fn assistant(reasoning: Option<&str>, content: &str, calls: Vec<Value>) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if let Some(r) = reasoning {
        m["reasoning_content"] = json!(r);
    }
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

fn file_text(lines: usize) -> String {
    (1..=lines).map(|i| format!("    let v{i} = parse_field(&input[{i}..]).map_err(|e| Error::at({i}, e))?;\n")).collect()
}

/// The conversation: before each of the 10 turns, what arrives (a user
/// message or tool results); then the assistant message the model means.
/// Two user requests (turns 1 and 6), 12 tool calls, one parallel pair.
fn script(thinking: bool) -> Vec<(Vec<Value>, Value)> {
    let r = |text: &'static str| thinking.then_some(text);
    let user = |text: &str| json!({"role": "user", "content": text});
    let result = |i: usize, text: String| json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": text});
    vec![
        (
            vec![user("The parser tests fail since the last change to src/parse.rs. Find out why and fix it.")],
            assistant(r("I should read the parser first."), "", vec![call("read_file", json!({"path": "src/parse.rs"}))]),
        ),
        (
            vec![result(1, format!("pub fn parse(input: &str) -> Result<Record, Error> {{\n{}}}\n", file_text(24)))],
            assistant(r("Now run the tests to see the failure."), "", vec![call("run_shell", json!({"command": "cargo test -p parser"}))]),
        ),
        (
            vec![result(2, "running 12 tests\ntest parse::empty ... FAILED\n\nfailures:\n---- parse::empty stdout ----\nthread 'parse::empty' panicked at src/parse.rs:3:41:\nrange start index 1 out of range for slice of length 0\n\ntest result: FAILED. 11 passed; 1 failed".into())],
            assistant(
                r("Field 1 is read before the length is checked; guard empty input."),
                "The first field is sliced before the input length is checked.",
                vec![call("edit_file", json!({"path": "src/parse.rs", "edits": [
                    {"old": "pub fn parse(input: &str) -> Result<Record, Error> {\n", "new": "pub fn parse(input: &str) -> Result<Record, Error> {\n    if input.is_empty() {\n        return Err(Error::Empty);\n    }\n"}]}))],
            ),
        ),
        (
            vec![result(3, "{\"ok\": true, \"replaced\": 1}".into())],
            assistant(r("Run the tests again."), "", vec![call("run_shell", json!({"command": "cargo test -p parser", "timeout_s": 120}))]),
        ),
        (
            vec![result(4, "running 12 tests\n............\ntest result: ok. 12 passed; 0 failed".into())],
            assistant(r("All pass; summarise."), "Fixed: `parse` now returns `Error::Empty` for empty input instead of slicing it; all 12 tests pass.", vec![]),
        ),
        (
            vec![user("Thanks. Add a regression test for the empty input, then run fmt and clippy.")],
            assistant(r("Look at the existing tests."), "", vec![call("read_file", json!({"path": "tests/parse.rs", "start_line": 1}))]),
        ),
        (
            vec![result(6, format!("use parser::parse;\n\n#[test]\nfn one_field() {{\n{}}}\n", file_text(12)))],
            assistant(r("Append a test."), "", vec![call("edit_file", json!({"path": "tests/parse.rs", "edits": [
                {"old": "use parser::parse;\n", "new": "use parser::{parse, Error};\n\n#[test]\nfn empty_input_is_an_error() {\n    assert!(matches!(parse(\"\"), Err(Error::Empty)));\n}\n"}]}))]),
        ),
        (
            vec![result(7, "{\"ok\": true, \"replaced\": 1}".into())],
            assistant(r("Run the new test."), "", vec![call("run_shell", json!({"command": "cargo test -p parser empty_input"}))]),
        ),
        (
            vec![result(8, "running 1 test\ntest empty_input_is_an_error ... ok\n\ntest result: ok. 1 passed; 0 failed".into())],
            assistant(
                r("fmt and clippy are independent: call both."),
                "",
                vec![call("run_shell", json!({"command": "cargo fmt --check"})), call("run_shell", json!({"command": "cargo clippy -p parser -- -D warnings"}))],
            ),
        ),
        (
            vec![result(9, String::new()), result(10, "    Checking parser v0.3.1\n    Finished `dev` profile in 2.31s".into())],
            assistant(r("Both clean."), "Added `empty_input_is_an_error`; fmt and clippy are clean.", vec![]),
        ),
    ]
}

/// One turn's numbers.
struct Turn {
    /// What arrived before it ("user", "2 tool results").
    arrived: String,
    prompt: usize,
    /// The previous turn's prompt + answer: the session's tokens.
    previous: usize,
    /// Leading prompt tokens equal to the previous turn's prompt + answer.
    common: usize,
    /// The whole blocks of `common` a session can hand over (at most the
    /// prompt less one token).
    reusable: usize,
    /// What kvc reused.
    cached: usize,
    /// Where this prompt's text leaves the previous prompt + answer (None:
    /// it extends them).
    diverges_at: Option<String>,
}

fn run(engine: &EngineHandle, session: &str, prompt: Vec<u32>) -> usize {
    let sampling = SamplingParams { temperature: 0.0, max_tokens: 1, ignore_eos: true, ..Default::default() };
    let mut s = engine
        .submit(GenerateRequest {
            request_id: session.into(),
            prompt_tokens: prompt,
            sampling,
            session_id: Some(session.into()),
            ..Default::default()
        })
        .expect("submitted");
    while let Some(ev) = s.blocking_recv() {
        match ev {
            StreamEvent::Finished { usage, .. } => return usage.cached_tokens,
            StreamEvent::Error(e) => panic!("engine error: {e}"),
            _ => {}
        }
    }
    panic!("stream ended without a result")
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The conversation under `file`'s template; `echo_reasoning`: the client
/// sends `reasoning_content` back.
fn conversation(engine: &EngineHandle, tok: &TextTokenizer, file: &str, echo_reasoning: bool) -> Vec<Turn> {
    let (template, format) = template(file);
    let tools = tools();
    let tools_value = Value::Array(tools.clone());
    let no_kwargs = Map::new();
    let session = format!("{file}/{echo_reasoning}");
    let render = |history: &[Value], add_generation_prompt: bool| {
        let wire: Vec<ChatMessage> = serde_json::from_value(Value::Array(history.to_vec())).expect("wire messages");
        let messages = template_messages(&wire).expect("template messages");
        template.render(&messages, Some(&tools_value), add_generation_prompt, &no_kwargs).expect("renders")
    };
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent working in a Rust repository."})];
    let mut previous: Option<(String, Vec<u32>)> = None;
    let mut turns = Vec::new();
    for (i, (incoming, meant)) in script(file.contains("thinking")).into_iter().enumerate() {
        let arrived = match incoming.len() {
            _ if incoming[0]["role"] == "user" => "user".to_string(),
            1 => "tool result".to_string(),
            n => format!("{n} tool results"),
        };
        history.extend(incoming);
        let prompt = render(&history, true);
        // The answer: the template's rendering of the meant message, after the prompt.
        let mut with = history.clone();
        with.push(meant);
        let full = render(&with, false);
        assert!(full.starts_with(&prompt), "{file} turn {}: the answer does not continue the prompt", i + 1);
        let answer = &full[prompt.len()..full.rfind("<|im_end|>").expect("closed turn")];
        // What kvc's response returns for it, as the client sends it back.
        let parser = ToolParser::new(format, &tools, true);
        let (mut p, _) = ChatParser::primed(open_assistant_turn(&prompt), Some(parser));
        let (a, b) = (p.push(answer), p.finish());
        let (reasoning, content) = (a.reasoning + &b.reasoning, a.content + &b.content);
        let calls: Vec<Value> = a.calls.into_iter().chain(b.calls).enumerate().map(|(j, c)| {
            json!({"id": format!("call_{}", i + 1 + j), "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
        }).collect();
        let mut msg = json!({"role": "assistant", "content": if content.is_empty() { Value::Null } else { json!(content) }});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if echo_reasoning && !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        history.push(msg);

        let p_tokens = tok.encode(&prompt, false).expect("encodes");
        let a_tokens = tok.encode(answer, false).expect("encodes");
        let (common, diverges_at) = match &previous {
            None => (0, None),
            Some((text, tokens)) => {
                let at = text.char_indices().zip(prompt.chars()).find(|((_, x), y)| x != y).map(|((at, _), _)| at);
                let at = at.or((prompt.len() < text.len()).then_some(prompt.len()));
                // Shown from the start of the line it is on (at most 24 bytes back).
                let at = at.map(|at| text[..at].rfind('\n').map_or(0, |n| n + 1).max(at.saturating_sub(24)));
                let at = at.map(|mut at| {
                    while !text.is_char_boundary(at) {
                        at += 1;
                    }
                    at
                });
                let show = |s: &str, at: usize| s[at..].chars().take(28).collect::<String>().replace('\n', "\\n");
                (common_prefix(tokens, &p_tokens), at.map(|at| format!("`` {} `` became `` {} ``", show(text, at), show(&prompt, at))))
            }
        };
        let reusable = common.min(p_tokens.len() - 1) / BS * BS;
        let mut seq = p_tokens.clone();
        seq.extend(&a_tokens);
        let cached = run(engine, &session, seq.clone());
        let previous_len = previous.as_ref().map_or(0, |(_, t)| t.len());
        turns.push(Turn { arrived, prompt: p_tokens.len(), previous: previous_len, common, reusable, cached, diverges_at });
        previous = Some((format!("{prompt}{answer}"), seq));
    }
    turns
}

fn table(name: &str, turns: &[Turn]) -> String {
    let pct = |a: usize, b: usize| if b == 0 { "-".to_string() } else { format!("{:.1} %", 100.0 * a as f64 / b as f64) };
    let mut out = format!(
        "\n{name}\n\n| turn | after | prompt tokens | previous prompt + answer | extend it | reused by kvc | of the previous | of the prompt | the template re-rendered |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---|\n"
    );
    for (i, t) in turns.iter().enumerate() {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            i + 1,
            t.arrived,
            t.prompt,
            t.previous,
            t.common,
            t.cached,
            pct(t.cached, t.previous),
            pct(t.cached, t.prompt),
            t.diverges_at.as_deref().unwrap_or("")
        );
    }
    let sum = |f: fn(&Turn) -> usize| turns.iter().skip(1).map(f).sum::<usize>();
    let (previous, prompt, cached) = (sum(|t| t.previous), sum(|t| t.prompt), sum(|t| t.cached));
    out += &format!(
        "\nTurns 2-10: {cached} tokens reused, {} of the previous turns' KV and {} of the prompts.\n",
        pct(cached, previous),
        pct(cached, prompt)
    );
    out
}

#[test]
fn session_reuse_per_turn_under_each_checkpoint_template() {
    let engine = EngineHandle::start(EngineConfig {
        num_kv_blocks: Some(4096),
        block_size: BS,
        // Only the session path: another conversation's blocks in the
        // prefix index must not count.
        enable_prefix_caching: false,
        ..Default::default()
    })
    .expect("engine starts");
    let tok = TextTokenizer::embedded_qwen3().expect("tokenizer");
    let runs = [
        ("Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder-30b-a3b-instruct.jinja", false),
        ("Qwen3-Coder-30B-A3B-Instruct, July 2025 template", "qwen3-coder-30b-a3b-instruct-2025-07.jinja", false),
        ("Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b-instruct-2507.jinja", false),
        ("Qwen3-30B-A3B-Thinking-2507, client sends reasoning_content back", "qwen3-30b-a3b-thinking-2507.jinja", true),
        ("Qwen3-30B-A3B-Thinking-2507, client drops reasoning_content", "qwen3-30b-a3b-thinking-2507.jinja", false),
    ];
    let mut report = String::new();
    for (name, file, echo) in runs {
        let turns = conversation(&engine, &tok, file, echo);
        report += &table(name, &turns);
        assert_eq!(turns.len(), 10);
        for (i, t) in turns.iter().enumerate() {
            // kvc keeps the longest common prefix, in whole blocks.
            assert_eq!(t.cached, t.reusable, "{name}, turn {}", i + 1);
            // Where the text extends the previous turn, so do the tokens.
            if i > 0 && t.diverges_at.is_none() {
                assert!(t.common + BS > turns[i - 1].prompt, "{name}, turn {}: {} of {}", i + 1, t.common, turns[i - 1].prompt);
            }
        }
        let rerendered: Vec<usize> = turns.iter().enumerate().filter(|(_, t)| t.diverges_at.is_some()).map(|(i, _)| i + 1).collect();
        match (file.contains("thinking"), echo) {
            // No reasoning in history: every turn extends the one before.
            (false, _) => assert!(rerendered.is_empty(), "{name}: turns {rerendered:?} re-render history"),
            // Within one user request the reasoning stays; the next request
            // (turn 6) drops the earlier turns' <think> blocks.
            (true, true) => assert_eq!(rerendered, vec![6], "{name}"),
            // Every answer's <think> block is gone from the next prompt.
            (true, false) => assert_eq!(rerendered, (2..=10).collect::<Vec<_>>(), "{name}"),
        }
    }
    println!("{report}");
    if let Ok(path) = std::env::var("KVC_TEMPLATE_REUSE_REPORT") {
        std::fs::write(&path, &report).expect("report written");
    }
}
