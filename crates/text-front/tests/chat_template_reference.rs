//! kvc's chat template rendering against Hugging Face transformers'
//! `apply_chat_template` for Qwen3.
//!
//! The fixtures come from `scripts/make_chat_template_fixtures.py` (run with
//! a Python environment that has transformers); each case is rendered here
//! with the template of the tokenizer embedded in kvc and must match HF's
//! output byte for byte.

use kvc_text_front::chat_template::ChatTemplate;
use kvc_text_front::tokenizer::TextTokenizer;
use serde_json::Value;

mod template_case;
use template_case::render_case;

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
        let expected = case["expected"].as_str().expect("expected");
        match render_case(&template, case) {
            Ok(got) if got == expected => {}
            Ok(got) => failures.push(format!("case {name}:\n--- expected ---\n{expected}\n--- got ---\n{got}\n")),
            Err(e) => failures.push(format!("case {name}: render failed: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
