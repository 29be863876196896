//! kvc's chat template rendering against Hugging Face transformers'
//! `apply_chat_template` for Qwen3.
//!
//! The fixtures come from `scripts/make_chat_template_fixtures.py` (run with
//! a Python environment that has transformers); each case is rendered here
//! with the template of the tokenizer embedded in kvc and must match HF's
//! output byte for byte.

use kvc_engine::chat_template::ChatTemplate;
use kvc_engine::tokenizer::TextTokenizer;
use serde_json::{Map, Value};

const FIXTURES: &str = include_str!("fixtures/chat_template_cases.json");

#[test]
fn embedded_qwen3_template_matches_hf_apply_chat_template() {
    let tok = TextTokenizer::embedded_qwen3().expect("embedded tokenizer");
    let template = ChatTemplate::from_tokenizer(&tok).expect("template compiles").expect("Qwen3 has a template");
    let cases: Vec<Value> = serde_json::from_str(FIXTURES).expect("fixtures parse");
    assert!(cases.len() >= 9, "expected the full fixture set, got {}", cases.len());

    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let tools = match &case["tools"] {
            Value::Null => None,
            t => Some(t),
        };
        let add_generation_prompt = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
        let empty = Map::new();
        let kwargs = case["kwargs"].as_object().unwrap_or(&empty);
        let expected = case["expected"].as_str().expect("expected");
        match template.render(&case["messages"], tools, add_generation_prompt, kwargs) {
            Ok(got) if got == expected => {}
            Ok(got) => failures.push(format!("case {name}:\n--- expected ---\n{expected}\n--- got ---\n{got}\n")),
            Err(e) => failures.push(format!("case {name}: render failed: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
