//! One case of a chat-template fixture (scripts/make_chat_template_fixtures.py,
//! make_checkpoint_template_fixtures.py: what transformers'
//! `apply_chat_template` was given), rendered by kvc with the same inputs.

use kvc_text_front::chat_template::ChatTemplate;
use kvc_text_front::TextFrontError;
use serde_json::{Map, Value};

/// `template` over the case's `messages`, `tools` (null: none),
/// `add_generation_prompt` and `kwargs`.
pub fn render_case(template: &ChatTemplate, case: &Value) -> Result<String, TextFrontError> {
    let tools = match &case["tools"] {
        Value::Null => None,
        t => Some(t),
    };
    let add_generation_prompt = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
    let empty = Map::new();
    let kwargs = case["kwargs"].as_object().unwrap_or(&empty);
    template.render(&case["messages"], tools, add_generation_prompt, kwargs)
}
