//! kvc's rendering of the chat templates the Qwen3 agent checkpoints ship
//! (Qwen3-Coder-30B-A3B-Instruct, Qwen3-30B-A3B-Instruct-2507 and
//! -Thinking-2507; `fixtures/templates/`, provenance in its README) against
//! Hugging Face transformers' `apply_chat_template` on the same templates.
//!
//! The fixtures come from `scripts/make_checkpoint_template_fixtures.py`;
//! every case must render byte for byte as transformers rendered it, and a
//! case transformers could not render must be a template error here too.

use std::path::PathBuf;

use kvc_text_front::chat_template::ChatTemplate;
use kvc_text_front::TextFrontError;
use serde_json::Value;

mod template_case;
use sha2::{Digest, Sha256};
use template_case::render_case;

const FIXTURES: &str = include_str!("fixtures/checkpoint_template_cases.json");

/// The templates' bytes, as the README there records them (SHA-256 of the
/// file as committed).
const TEMPLATES: [(&str, &str); 4] = [
    ("qwen3-coder-30b-a3b-instruct.jinja", "5a38bfa05833266240066aedc497decc9b00cc0d3e3b8cceea98cf530196ab06"),
    ("qwen3-coder-30b-a3b-instruct-2025-07.jinja", "672e747c77e990320152343b0a4951222e40de5645297905d89afba05586d827"),
    ("qwen3-30b-a3b-instruct-2507.jinja", "64f85b198065d0fba2a81f37e10ed68161ce2c19a754c7100e67e0ca2ee9c326"),
    ("qwen3-30b-a3b-thinking-2507.jinja", "3802169b2a02b81e6adb7ab4f64f91ff02db753c8c3a64a01c35192d3a61d8d7"),
];

fn template_source(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn template_files_are_the_recorded_bytes() {
    for (name, sha) in TEMPLATES {
        assert_eq!(hex(&Sha256::digest(template_source(name).as_bytes())), sha, "{name}");
    }
}

#[test]
fn checkpoint_templates_render_as_transformers_does() {
    let cases: Vec<Value> = serde_json::from_str(FIXTURES).expect("fixtures parse");
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    let mut failures = Vec::new();
    for case in &cases {
        let file = case["template"].as_str().expect("template");
        *seen.entry(file).or_default() += 1;
        let template = ChatTemplate::new(&template_source(file)).unwrap_or_else(|e| panic!("{file} compiles: {e}"));
        let name = case["name"].as_str().expect("name");
        let got = render_case(&template, case);
        match (&case["expected"], got) {
            (Value::String(expected), Ok(got)) if &got == expected => {}
            (Value::String(expected), Ok(got)) => {
                let at = expected.char_indices().zip(got.chars()).find(|((_, a), b)| a != b).map(|((i, _), _)| i);
                failures.push(format!("{file} / {name}: differs at byte {at:?}\n--- expected ---\n{expected}\n--- got ---\n{got}\n"))
            }
            (Value::String(_), Err(e)) => failures.push(format!("{file} / {name}: render failed: {e}")),
            (Value::Null, Err(TextFrontError::Template(_))) => {}
            (Value::Null, other) => failures
                .push(format!("{file} / {name}: transformers failed ({}), kvc gave {other:?}", case["error"].as_str().unwrap_or_default())),
            (other, _) => panic!("bad fixture {file} / {name}: expected = {other}"),
        }
    }
    // Every template is covered by the whole case list.
    assert_eq!(seen.len(), TEMPLATES.len(), "{seen:?}");
    assert!(seen.values().all(|n| *n >= 15), "{seen:?}");
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
